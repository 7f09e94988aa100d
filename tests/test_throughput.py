"""The throughput meter both backends log through: which global steps get a line, what it
says, and the run's means."""

from __future__ import annotations

import logging
import re
import time

import pytest

from tfconfig_slurm.process.task.throughput import LossSinceLastLine, Throughput, epoch_steps


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A monotonic clock the test moves: one second a step unless told otherwise."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_a_trainer_sharing_steps_logs_where_the_global_step_passes_a_multiple(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """With a parameter server two trainers share the steps: this one sees every other global
    step, and still logs near every tenth global step, not every tenth of its own."""
    caplog.set_level(logging.INFO)
    meter = Throughput(10)
    for global_step in range(1, 42, 2):
        meter.step(global_step, examples=64, loss=0.5)
        clock[0] += 1.0
    logged = [int(m.group(1)) for m in map(re.compile(r"step (\d+):").match, lines(caplog)) if m]
    assert logged == [11, 21, 31, 41]
    assert lines(caplog)[0] == "first step done (global step 1)"
    # 5 of this trainer's steps a line: 320 examples and 10 global steps in 5 s.
    assert "step 11: loss 0.5, 64.0 examples/s, 2.00 global steps/s" in lines(caplog)


def test_the_end_says_the_mean_from_the_second_step_to_the_last(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    meter = Throughput(100)
    clock[0] += 30.0  # the first step builds the model: left out of the mean
    meter.step(1, examples=32, loss=None)
    for global_step in range(2, 12):
        clock[0] += 0.5
        meter.step(global_step, examples=32, loss=None)
    mean = meter.end()
    assert mean is not None
    # 10 steps of 32 examples in 5 s.
    assert mean.examples_per_sec == pytest.approx(64.0)
    assert meter.global_step == 11
    assert lines(caplog)[-1] == "last step done after 11 steps here; mean 64.0 examples/s"


def test_without_counted_examples_the_line_says_global_steps_only(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    meter = Throughput(2, counts_examples=False)
    for global_step in (1, 2, 3):
        meter.step(global_step, examples=0, loss=1.25)
        clock[0] += 1.0
    assert "step 2: loss 1.25, 1.00 global steps/s" in lines(caplog)
    assert meter.mean_examples_per_sec() is None
    meter.end()
    assert lines(caplog)[-1] == "last step done after 3 steps here; mean - examples/s"


def test_a_run_too_short_has_no_mean(clock: list[float]) -> None:
    meter = Throughput(10)
    meter.step(5, examples=8, loss=None)
    assert meter.mean() is None
    assert meter.global_step == 5


def test_a_line_says_the_mean_loss_of_the_steps_since_the_last_line() -> None:
    """Keras's fit gives the running mean since the epoch began: losses 4, 2, 6, 2 come as
    4, 3, 4, 3.5. A line after step 2 says 2 (step 1 is the first step's, left out as the
    rates leave it out); the next, after step 4, the mean of 6 and 2."""
    loss = LossSinceLastLine()
    assert loss.mean(1, 4.0, 1) == 4.0
    assert loss.mean(2, 3.0, 2) == 2.0
    loss.said()
    assert loss.mean(3, 4.0, 3) == 6.0
    assert loss.mean(4, 3.5, 4) == 4.0


def test_the_loss_read_only_where_a_line_may_come_is_the_same_mean(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """The tf-keras trainer reads fit's running loss (waiting for its step to finish) only
    where `due` says a line may come: the first step and a multiple of the interval. Losses
    1, 2, ..., 8 come as running means; a line every 4 steps says the mean of steps 2-4, then
    of 5-8, as if it had read every step."""
    caplog.set_level(logging.INFO)
    meter, loss = Throughput(4), LossSinceLastLine()
    read = []
    for step in range(1, 9):
        said = None
        if meter.due(step):
            read.append(step)
            said = loss.mean(step, sum(range(1, step + 1)) / step, step)
        if meter.step(step, examples=1, loss=said) is not None:
            loss.said()
        clock[0] += 1.0
    assert read == [1, 4, 8]
    assert [line.split(",")[0] for line in lines(caplog)[1:]] == [
        "step 4: loss 3",
        "step 8: loss 6.5",
    ]


def test_steps_counted_in_bulk_say_their_loss_in_the_first_line(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """A coordinator counts an epoch's steps at once: its first line has their loss, the
    rates wait for the second."""
    caplog.set_level(logging.INFO)
    meter = Throughput(50)
    assert meter.step(50, examples=50 * 64, loss=0.41234, steps=50) is None
    clock[0] += 2.0
    rates = meter.step(100, examples=50 * 64, loss=0.3, steps=50)
    assert rates is not None and rates.examples_per_sec == 1600.0
    assert lines(caplog)[:2] == [
        "first step done (global step 50): loss 0.4123 over its 50 steps",
        "step 100: loss 0.3, 1600.0 examples/s, 25.00 global steps/s",
    ]


@pytest.mark.parametrize(
    ("left", "every", "steps"),
    [(1000, 100, 100), (1050, 100, 100), (100, 100, 50), (30, 40, 15), (25, 100, 5),
     (7, 100, 1), (1, 100, 1), (0, 100, 1)],
)  # fmt: skip
def test_a_coordinator_s_epochs_are_its_log_interval_or_whole_halves_or_less_of_a_short_run(
    left: int, every: int, steps: int
) -> None:
    """A run no longer than one interval still has two epochs or more, its last ending the
    run (one fit), so that the second logs a rate."""
    assert epoch_steps(left, every) == steps

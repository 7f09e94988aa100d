"""What follows each step of a Keras fit in both Keras backends (process/task/keras_run.py),
without Keras: the global step counted from fit's batches, the lines' loss and TensorBoard
scalars, the checkpoints and the stop."""

from __future__ import annotations

from collections.abc import Mapping

from tests.test_cadence import settings
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.task.keras_run import FitSteps, Lines, StepEnds


def fit_steps(
    start: int, stop: preemption.StopRequest, loss_scale: int = 1
) -> tuple[FitSteps, list[tuple[int, dict[str, float]]], list[int]]:
    """Steps from global step `start` of a run to 100, a checkpoint every 20 steps and a line
    every 10; with the scalars its lines wrote, and the steps it saved."""
    scalars: list[tuple[int, dict[str, float]]] = []
    saved: list[int] = []

    def write(values: Mapping[str, float], step: int) -> None:
        scalars.append((step, dict(values)))

    run = settings(20)
    steps = FitSteps(
        start_step=start,
        settings=run,
        lines=Lines(start, 10, 8, write, loss_scale),
        ends=StepEnds(run, stop, {"SIGUSR1"}, None),
        save=saved.append,
    )
    return steps, scalars, saved


def test_fit_s_batches_count_the_global_step_from_the_resumed_one_and_stop_on_a_signal() -> None:
    stop = preemption.StopRequest()
    steps, scalars, saved = fit_steps(10, stop, loss_scale=2)
    # fit's running mean of the loss, summed over 2 replicas: 4.0, then 8.0 from its 11th batch.
    for batch in range(20):
        running = 4.0 if batch < 10 else (4.0 * 10 + 12.0 * (batch - 9)) / (batch + 1)
        assert not steps.batch_end(batch, {"loss": running})
    assert (steps.step, saved) == (30, [20])
    stop.ask("SIGTERM")
    assert steps.batch_end(20, {"loss": 8.0})
    assert (steps.step, saved, steps.stopped_early()) == (31, [20, 31], "SIGTERM")
    steps.lines.end(steps.step)
    # A line at each multiple of 10 passed, its loss the mean since the last line, per replica.
    assert [(step, values["loss"]) for step, values in scalars] == [(20, 2.0), (30, 6.0)]
    assert all(values["global_steps_per_sec"] > 0 for _, values in scalars)


def test_a_stop_at_the_last_step_is_none_and_a_call_of_several_steps_ends_there() -> None:
    stop = preemption.StopRequest()
    steps, _, saved = fit_steps(95, stop)
    stop.ask("SIGTERM")
    # One call of 7 steps (--steps_per_execution) runs past --train_steps: its step is the last.
    assert steps.batch_end(6, {"loss": 1.0})
    assert (steps.step, saved, steps.stopped_early()) == (100, [100], None)
    steps.lines.end(steps.step)

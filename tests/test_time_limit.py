"""The stop before a job's time limit, without SLURM's warning signal (time_limit.py): squeue's
time left read, the stop at the margin, a limit that moves (no SLURM needed: squeue is asked
through a stand-in; the SLURM test of it is in test_faults.py)."""

from __future__ import annotations

import logging
import time

import pytest

from tests.cli import wait_until
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.process import time_limit
from tfconfig_slurm.process.preemption import StopRequest

JOB = SlurmJob(job_id=77, array_job_id=None, array_task_id=None, restart_count=0)


@pytest.mark.parametrize(
    ("shown", "seconds"),
    [
        ("45:10", 2710.0),
        ("1:02:03", 3723.0),
        ("2-01:00:00", 176400.0),
        ("0:05\n", 5.0),
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
        ("", None),
    ],
)
def test_squeue_s_time_left_in_seconds(shown: str, seconds: float | None) -> None:
    assert time_limit.parse_time_left(shown) == seconds


def answers(*lefts: float | str) -> time_limit.Ask:
    """squeue's answers, one a call, the last repeated."""
    given = list(lefts)
    return lambda job: given.pop(0) if len(given) > 1 else given[0]


def test_the_run_stops_at_the_margin_as_on_the_signal(caplog: pytest.LogCaptureFixture) -> None:
    stop = StopRequest()
    caplog.set_level(logging.INFO)
    started = time.monotonic()
    # 4 s left: the margin is at most half of that, so the stop comes 2 s in.
    time_limit.watch(JOB, stop, "SIGUSR1", 120.0, ask=answers(4.0))
    assert stop.wait(10.0)
    assert 1.5 <= time.monotonic() - started <= 3.5
    assert stop.signal_name == "SIGUSR1"
    assert "this run stops at" in caplog.text and "2 s before" in caplog.text
    assert "job 77 reaches its time limit in 2 s" in caplog.text


def test_a_limit_moved_later_moves_the_stop(caplog: pytest.LogCaptureFixture) -> None:
    stop = StopRequest()
    caplog.set_level(logging.INFO)
    # Asked again when the first stop was due (2 s in), the job has 100 s left.
    time_limit.watch(JOB, stop, "SIGUSR1", 2.0, ask=answers(4.0, 100.0))
    assert not stop.wait(4.0)
    assert "job 77's time limit moved to" in caplog.text
    stop.ask("SIGTERM")


def test_a_job_without_a_limit_is_not_watched(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    limit = time_limit.watch(JOB, stop, "SIGUSR1", 120.0, ask=answers("it has none (UNLIMITED)"))
    assert wait_until(lambda: "no time limit" in caplog.text, 5.0)
    assert "job 77: no time limit to stop before (it has none (UNLIMITED))" in caplog.text
    assert limit.deadline is None and not limit.due()


def test_a_task_that_only_follows_the_limit_never_stops_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's owner beside the task that requeues: it knows when the stop is due, to say
    why the run stopped, and neither stops nor logs it."""
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    # 14 s left: the margin is 7 s, and the stop counts as due 5 s before that, 2 s in.
    limit = time_limit.watch(JOB, stop, "SIGUSR1", 120.0, acts=False, ask=answers(14.0))
    assert wait_until(lambda: limit.deadline is not None, 5.0) and not limit.due()
    assert not stop.wait(3.0)
    assert limit.due()
    assert caplog.text == ""


def test_a_checkpoint_slower_than_half_the_margin_moves_the_stop_earlier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's owner, which writes the checkpoints, follows the limit beside the task that
    requeues: once a checkpoint took 5 s, it stops the job 10 s before the limit itself, where
    the margin of 2 s would have left too little for the final checkpoint."""
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    # squeue says 14 s at start, and 9 s when asked again before the stop, 5 s in.
    limit = time_limit.watch(JOB, stop, "SIGUSR1", 2.0, acts=False, ask=answers(14.0, 9.0))
    assert wait_until(lambda: limit.deadline is not None, 5.0) and not limit.due()
    started = time.monotonic()
    stop.checkpoint_written(20, 5.0)
    # 14 s left at start, less the 10 s margin: due about 4 s in, looked at every 5 s.
    assert stop.wait(10.0)
    assert time.monotonic() - started <= 6.0
    assert stop.signal_name == "SIGUSR1"
    assert "checkpoint of step 20 written in 5.00 s" in caplog.text
    assert "this task's checkpoints take up to 5.0 s; the run now stops at" in caplog.text
    assert "10 s before the time limit" in caplog.text
    assert "job 77 reaches its time limit in" in caplog.text
    assert limit.due()


def test_checkpoints_quicker_than_the_margin_leave_it_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    time_limit.watch(JOB, stop, "SIGUSR1", 120.0, acts=False, ask=answers(14.0))
    stop.checkpoint_written(20, 1.0)
    # The margin stays 7 s (half of 14): not due yet, and a follower never stops the job.
    assert not stop.wait(9.0)
    assert "take up to" not in caplog.text and "reaches its time limit" not in caplog.text


def test_a_limit_not_today_is_said_with_its_date(caplog: pytest.LogCaptureFixture) -> None:
    """A partition without MaxTime gives jobs 365 days: said as a time of day alone, it
    read as a limit already past."""
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    limit = time_limit.watch(JOB, stop, "SIGUSR1", 120.0, ask=answers(2 * 86400.0))
    assert wait_until(lambda: limit.deadline is not None, 5.0)
    assert wait_until(lambda: "ends at its time limit" in caplog.text, 5.0)
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() + 2 * 86400))
    assert f"ends at its time limit at {day} " in caplog.text, caplog.text
    stop.ask("SIGTERM")

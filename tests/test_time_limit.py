"""The stop before a job's time limit, without SLURM's warning signal (preemption.TimeLimit):
squeue's time left read, the stop at the margin, a limit that moves (no SLURM needed: squeue is
asked through a stand-in; the SLURM test of it is in test_faults.py)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.cli import wait_until
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.process import slurm_commands, timing
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.job.preemption import StopRequest

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
    assert preemption.parse_time_left(shown) == seconds


class Answers:
    """squeue's answers, one a call, the last repeated; the seconds each call was given."""

    def __init__(self, *lefts: float | preemption.NoLimit) -> None:
        self.given, self.seconds = list(lefts), list[float]()

    def __call__(self, job: str, seconds: float) -> float | preemption.NoLimit:
        self.seconds.append(seconds)
        return self.given.pop(0) if len(self.given) > 1 else self.given[0]

    @property
    def calls(self) -> int:
        return len(self.seconds)


FAILED = preemption.NoLimit("squeue failed: slurm_load_jobs error: Socket timed out", again=True)


def test_the_run_stops_at_the_margin_as_on_the_signal(caplog: pytest.LogCaptureFixture) -> None:
    stop = StopRequest()
    caplog.set_level(logging.INFO)
    # 4 s left: the margin is at most half of that, so the stop comes 2 s in.
    preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=Answers(4.0))
    assert stop.wait(10.0)
    assert stop.signal_name == "SIGUSR1"
    assert "this run stops at" in caplog.text and "2 s before" in caplog.text
    assert "job 77 reaches its time limit in 2 s" in caplog.text


def test_the_stop_is_taken_before_slurmctld_is_told_and_never_waits_on_squeue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """squeue's last look before the stop is given only until the stop to answer, and this
    task stops while scancel still waits on slurmctld (each may take up to a minute): the
    checkpoint is what must fit in the margin."""
    told = threading.Event()
    scancel_may_end = threading.Event()

    def slow_scancel(command: list[str], seconds: float = 60.0) -> str:
        told.set()
        scancel_may_end.wait(30.0)
        return ""

    monkeypatch.setattr(slurm_commands, "failure", slow_scancel)
    stop, asked = StopRequest(), Answers(4.0)
    preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=asked)
    try:
        assert stop.wait(10.0) and told.wait(10.0)
        # At start, a minute; the last look 2 s before the stop, those 2 s.
        assert asked.calls == 2 and asked.seconds[0] == 60.0 and asked.seconds[1] <= 2.0
    finally:
        scancel_may_end.set()


def test_a_squeue_that_fails_at_start_is_asked_again_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """slurmctld busy as the job starts: the limit is still kept once squeue answers."""
    monkeypatch.setattr(timing, "LIMIT_RETRY_SECONDS", 0.05)
    caplog.set_level(logging.INFO)
    stop, asked = StopRequest(), Answers(FAILED, FAILED, FAILED, 4.0)
    preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=asked)
    assert stop.wait(10.0)
    # Three failures, the answer, the last look before the stop.
    assert asked.calls == 5
    assert caplog.text.count("its time limit cannot be read yet (squeue failed: ") == 1
    assert "job 77 reaches its time limit in 2 s" in caplog.text


def test_a_squeue_that_keeps_failing_is_asked_ever_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(timing, "LIMIT_RETRY_SECONDS", 0.2)
    stop, asked = StopRequest(), Answers(FAILED)
    limit = preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=asked)
    # Asked at 0, 0.2, 0.6, 1.4 and 3.0 s: 4 or 5 times in 3 s, where every 0.2 s is 15.
    assert not stop.wait(3.0)
    assert 2 <= asked.calls <= 5 and limit.deadline is None
    stop.ask("SIGTERM")


def test_a_limit_moved_later_moves_the_stop(caplog: pytest.LogCaptureFixture) -> None:
    stop = StopRequest()
    caplog.set_level(logging.INFO)
    # Asked again before the first stop was due (2 s in), the job has 100 s left.
    preemption.watch(JOB, stop, "SIGUSR1", 2.0, ask=Answers(4.0, 100.0))
    assert not stop.wait(4.0)
    assert "job 77's time limit moved to" in caplog.text
    stop.ask("SIGTERM")


def test_the_last_look_comes_even_after_a_poll_just_before_its_window(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The regular poll (here at 1.5 s) lands just before the last look's window (from 2 s,
    the stop at 3 s): the last look still comes, and sees the limit raised."""
    monkeypatch.setattr(timing, "LIMIT_POLL_SECONDS", 1.5)
    monkeypatch.setattr(timing, "FINAL_LOOK_SECONDS", 1.0)
    caplog.set_level(logging.INFO)
    stop, asked = StopRequest(), Answers(6.0, 4.5, 100.0)
    preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=asked)
    assert not stop.wait(5.0)
    assert "job 77's time limit moved to" in caplog.text, caplog.text
    stop.ask("SIGTERM")


def test_a_job_without_a_limit_is_not_watched(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    none = preemption.NoLimit("it has none (UNLIMITED)", again=False)
    limit = preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=Answers(none))
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
    limit = preemption.watch(JOB, stop, "SIGUSR1", 120.0, acts=False, ask=Answers(14.0))
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
    limit = preemption.watch(JOB, stop, "SIGUSR1", 2.0, acts=False, ask=Answers(14.0))
    assert wait_until(lambda: limit.deadline is not None, 5.0) and not limit.due()
    stop.checkpoint_written(20, 5.0)
    # 14 s left at start, less the 10 s margin: due about 4 s in, looked at every 5 s.
    assert stop.wait(10.0)
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
    preemption.watch(JOB, stop, "SIGUSR1", 120.0, acts=False, ask=Answers(14.0))
    stop.checkpoint_written(20, 1.0)
    # The margin stays 7 s (half of 14): not due yet, and a follower never stops the job.
    assert not stop.wait(9.0)
    assert "take up to" not in caplog.text and "reaches its time limit" not in caplog.text


def test_a_limit_not_today_is_said_with_its_date(caplog: pytest.LogCaptureFixture) -> None:
    """A partition without MaxTime gives jobs 365 days: said as a time of day alone, it
    read as a limit already past."""
    caplog.set_level(logging.INFO)
    stop = StopRequest()
    limit = preemption.watch(JOB, stop, "SIGUSR1", 120.0, ask=Answers(2 * 86400.0))
    assert wait_until(lambda: limit.deadline is not None, 5.0)
    assert wait_until(lambda: "ends at its time limit" in caplog.text, 5.0)
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() + 2 * 86400))
    assert f"ends at its time limit at {day} " in caplog.text, caplog.text
    stop.ask("SIGTERM")

"""The preemption signal's name, and when a stopped job is not requeued (no SLURM needed)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tfconfig_slurm import errors
from tfconfig_slurm.cluster.step import CONTINUATION, read_slurm_job
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.job import preemption, what_follows


@pytest.mark.parametrize(
    ("name", "expected"),
    [("USR1", signal.SIGUSR1), ("sigusr2", signal.SIGUSR2), ("TERM", signal.SIGTERM), ("", None)],
)
def test_signal_names_as_sbatch_takes_them(name: str, expected: signal.Signals | None) -> None:
    assert preemption.parse_signal(name) == expected


@pytest.mark.parametrize("name", ["KILL", "SIGSTOP", "USR3", "10", "QUIT"])
def test_a_signal_that_cannot_be_caught_is_refused(name: str) -> None:
    with pytest.raises(UsageError, match="--preempt_signal"):
        preemption.parse_signal(name)


def test_the_request_is_a_flag_set_by_the_signal() -> None:
    stop = preemption.StopRequest()
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        stop.listen(signal.SIGUSR2)
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR2)
        assert stop.requested
        assert stop.signal_name == "SIGUSR2"
    finally:
        signal.signal(signal.SIGUSR2, previous)
        signal.set_wakeup_fd(-1)


# The main thread blocks the signal and sits in C (libc's sleep), as a trainer does in a
# TensorFlow step that waits on a dead peer: Python cannot run its handler there.
BLOCKED_IN_C = """
import ctypes, os, signal, threading, time
from tfconfig_slurm.process.job import preemption

stop = preemption.StopRequest()
stop.listen(signal.SIGUSR2)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
seen = []
threading.Thread(target=lambda: (stop.wait(), seen.append(time.monotonic()))).start()
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2)).start()
started = time.monotonic()
ctypes.CDLL(None).sleep(3)
print(f"{seen[0] - started:.2f} {stop.signal_name}")
"""


def test_a_stop_is_seen_while_the_main_thread_is_inside_c_code() -> None:
    child = subprocess.run(
        [sys.executable, "-c", BLOCKED_IN_C], capture_output=True, text=True, timeout=60, check=True
    )
    seconds, name = child.stdout.split()
    assert name == "SIGUSR2"
    # Seen as it came (0.2 s), not once the main thread left C (3 s).
    assert float(seconds) < 1.5, child.stdout


# The signal comes while the main thread holds the request's own lock, as it does inside
# Event.set when a second signal interrupts the handler of the first (scancel and a task's
# supervisor each pass on SLURM's warning): a handler that set the event there waited for
# itself for ever.
INSIDE_THE_LOCK = """
import os, signal
from tfconfig_slurm.process.job import preemption

stop = preemption.StopRequest()
stop.listen(signal.SIGUSR2)
with stop._event._cond:
    os.kill(os.getpid(), signal.SIGUSR2)
    noted = stop.requested
print(noted, stop.wait(10), stop.signal_name)
"""


def test_a_signal_inside_the_requests_own_lock_does_not_hang_the_task() -> None:
    child = subprocess.run(
        [sys.executable, "-c", INSIDE_THE_LOCK],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert child.stdout.split() == ["True", "True", "SIGUSR2"], child.stdout


@pytest.mark.parametrize(
    "counts",
    [{"SLURM_RESTART_COUNT": "3"}, {"SLURM_RESTART_COUNT": "1", CONTINUATION: "2"}],
    ids=["requeued", "requeued-and-continued"],
)
def test_a_job_at_its_requeue_limit_ends_and_says_so(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, counts: dict[str, str]
) -> None:
    environ = {"SLURM_JOB_ID": "77", **counts}
    with caplog.at_level(logging.INFO):
        status = what_follows.requeue(environ, read_slurm_job(environ), 3, "SIGUSR1", tmp_path)
    assert status == errors.ExitStatus.NOT_REQUEUED
    (record,) = caplog.records
    assert (
        "job 77 stopped on SIGUSR1 and the run was requeued or continued 3 times already"
        in record.getMessage()
    )
    assert "--max_requeues=3" in record.getMessage()


def test_outside_slurm_there_is_nothing_to_requeue(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    with caplog.at_level(logging.INFO):
        assert what_follows.requeue({}, None, 3, "SIGUSR1", tmp_path) == 0
    assert "outside a SLURM job" in caplog.records[0].getMessage()


def test_a_failed_requeue_is_an_error_that_names_the_job(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A Slurm configuration without a cluster (or no scontrol at all): scontrol fails at once.
    # (With no file at all it retries for 60 s.)
    (tmp_path / "slurm.conf").touch()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    environ = {"SLURM_JOB_ID": "1", "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "2"}
    with caplog.at_level(logging.INFO):
        status = what_follows.requeue(
            environ, read_slurm_job(environ), 3, "SIGUSR1", tmp_path / "run"
        )
    assert status == errors.ExitStatus.NOT_REQUEUED
    said = caplog.records[0].getMessage()
    assert "`scontrol requeue 5_2` failed" in said
    assert "and its state cannot be read (scontrol show job failed" in said
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_s_line_says_apart_its_wait_for_the_steps_dispatched_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keras 3 on JAX runs ahead of its devices: a checkpoint mid-fit first waits for them. The
    stop before the time limit counts the whole; the line says what was the wait."""
    stop = preemption.StopRequest()
    with caplog.at_level(logging.INFO):
        stop.checkpoint_written(30, 4.2, 3.8)
        stop.checkpoint_written(60, 0.4, 0.01)
    assert stop.longest_checkpoint == 4.2
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "checkpoint of step 30 written in 4.20 s, 3.80 s of it waiting for the steps dispatched "
        "before it",
        "checkpoint of step 60 written in 0.40 s",
    ]

"""SIGTERM (a time limit, scancel, a preemption without warning) stops training at a step with
a checkpoint that holds every step taken; SIGQUIT writes every thread's stack and changes
nothing; SIGTERM to a --local_cluster launcher stops every task and leaves none behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests import fake_backend
from tests.cli import PACED, REPOSITORY, checkpoint_step, free_port_block, wait_until
from tests.test_local_cluster import alive, started_pids

# Importing TensorFlow and reaching the first steps, on 2 cores.
START_SECONDS = 120.0
# SLURM's default KillWait: SIGKILL follows SIGTERM after this.
KILL_WAIT_SECONDS = 30.0
TRAIN_LONG = (f"--experiment={PACED}", "--train_steps=1000000", "--log_every_steps=1")


def start(
    root: Path, *flags: str, environ: Mapping[str, str] = {}
) -> tuple[subprocess.Popen[str], Path]:
    """The runtime as a user starts it, its console to a file the test reads as it grows;
    `environ` added to this process's."""
    console = root / "console.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={root}", *flags],
        env={**os.environ, **environ},
        stdout=subprocess.DEVNULL,
        stderr=console.open("w"),
        cwd=REPOSITORY,
        text=True,
    )
    return process, console


def wait_for(console: Path, pattern: str, process: subprocess.Popen[str]) -> str:
    seen = wait_until(lambda: re.search(pattern, console.read_text()) is not None, START_SECONDS)
    if not seen:
        process.kill()
        pytest.fail(f"no {pattern!r}:\n{console.read_text()[-3000:]}")
    return console.read_text()


def ended(process: subprocess.Popen[str]) -> int:
    try:
        return process.wait(timeout=KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {KILL_WAIT_SECONDS:.0f} s after SIGTERM, when SLURM kills")


@pytest.mark.tensorflow
def test_sigterm_checkpoints_every_step_and_sigquit_shows_stacks(tmp_path: Path) -> None:
    process, console = start(tmp_path, *TRAIN_LONG)
    wait_for(console, r"step \d+: loss \S+, [\d.]+ examples/s", process)
    process.send_signal(signal.SIGQUIT)
    log = wait_for(console, r"(?s)Current thread 0x.*File ", process)
    assert "Thread 0x" in log  # the other threads too
    assert process.poll() is None  # and it trains on
    process.send_signal(signal.SIGTERM)
    assert ended(process) == 0
    log = console.read_text()
    (stopped,) = map(int, re.findall(r"stopping on SIGTERM at global step (\d+)", log))
    # Outside a SLURM job, no job to requeue is spoken of.
    assert f"run again with the same model directory, {tmp_path / 'paced'}, to resume" in log
    assert "not requeueing the job" not in log
    assert checkpoint_step(tmp_path / "paced") == stopped
    # Evaluated as Estimator does after a checkpoint; exported and summed up only at the end.
    assert (tmp_path / "paced" / "eval").is_dir()
    assert not any((tmp_path / "paced" / name).exists() for name in ("export", "summary.json"))

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfconfig_slurm.run",
            f"--output_root={tmp_path}",
            f"--experiment={PACED}",
            f"--train_steps={stopped + 2}",
        ],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step {stopped}" in resumed.stderr


@pytest.mark.parametrize(
    ("signum", "status", "environ"),
    # SIGUSR1, the preempt signal (#SBATCH --signal, the stop before a time limit), goes on to
    # the tasks, which stop as they would on their own; outside SLURM nothing is requeued.
    # Estimator's stop, its ps barrier, holds on SIGTERM; the launcher's on both.
    [
        pytest.param(signal.SIGTERM, 128 + signal.SIGTERM, {}, marks=pytest.mark.tensorflow),
        (signal.SIGUSR1, 0, fake_backend.environ()),
    ],
    ids=["SIGTERM", "SIGUSR1-fake"],
)
def test_a_signal_to_a_local_cluster_stops_every_task_at_a_checkpoint(
    tmp_path: Path, signum: signal.Signals, status: int, environ: dict[str, str]
) -> None:
    process, console = start(
        tmp_path,
        *TRAIN_LONG,
        "--local_cluster=ps=1,workers=1",
        "--save_checkpoints_steps=50",
        environ=environ,
    )
    wait_for(console, r"(?s)first step done.*first step done", process)
    process.send_signal(signum)
    assert ended(process) == status
    log = console.read_text()
    pids = started_pids(log)
    assert sorted(pids) == ["chief 0", "ps 0", "worker 0"]
    assert wait_until(lambda: not [pid for pid in pids.values() if alive(pid)], 5.0)
    stopped = list(map(int, re.findall(rf"stopping on {signum.name} at global step (\d+)", log)))
    assert len(stopped) == 2  # the chief and the worker
    assert checkpoint_step(tmp_path / "paced") == max(stopped)
    assert environ or "ps 0: 2 of 2 trainers finished" in log


def test_ctrl_c_twice_ends_a_task_that_waits_for_a_peer_that_never_started(tmp_path: Path) -> None:
    """Its first SIGINT asks for a stop at the next step, which never comes while the chief
    waits for its ps (the watchdog gives a peer that never answered 600 s to start); the
    second ends it at once."""
    base = free_port_block(2)
    tf_config = json.dumps(
        {"cluster": {"chief": [f"localhost:{base}"], "ps": [f"localhost:{base + 1}"]},
         "task": {"type": "chief", "index": 0}}
    )  # fmt: skip
    console = tmp_path / "console.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={tmp_path}",
         f"--experiment={PACED}", "--train_steps=10"],
        env={"PATH": os.environ["PATH"], "TF_CONFIG": tf_config, **fake_backend.environ()},
        stdout=subprocess.DEVNULL, stderr=console.open("w"), cwd=REPOSITORY, text=True,
    )  # fmt: skip
    wait_for(console, r"chief 0 on \S+ at localhost:", process)
    process.send_signal(signal.SIGINT)
    wait_for(
        console, r"SIGINT: stopping at the next step, with a checkpoint; Ctrl-C again", process
    )
    assert process.poll() is None
    process.send_signal(signal.SIGINT)
    assert ended(process) == 130
    assert "SIGINT again: ending at once, without a checkpoint" in console.read_text()


# The runtime's entry with a stop signal delivered as soon as it is held, before the imports
# and the listening, as where a job is told to stop while its step's tasks start; or, as
# launch/train.sbatch starts a task (with the stop signals blocked), before even that.
_ENTRY = """
import os, runpy, signal, sys
from tfconfig_slurm.process import held_signals
hold = held_signals.hold
held_signals.hold = lambda: (hold(), os.kill(os.getpid(), signal.{name}))
sys.argv = ["tfconfig-slurm-run", *sys.argv[1:]]
runpy.run_module("tfconfig_slurm.run", run_name="__main__")
"""
_BLOCKED_ENTRY = """
import os, runpy, signal, sys
os.kill(os.getpid(), signal.{name})
sys.argv = ["tfconfig-slurm-run", *sys.argv[1:]]
runpy.run_module("tfconfig_slurm.run", run_name="__main__")
"""
_BLOCKED = ("env", "--block-signal=USR1,USR2,TERM")


@pytest.mark.parametrize("blocked", [False, True], ids=["", "blocked"])
@pytest.mark.parametrize(
    ("signum", "said"),
    [
        # The preempt signal: the task stops before its first step, with a checkpoint.
        (signal.SIGUSR1, "stopping on SIGUSR1 at global step 0"),
        # One it does not listen for ends it as that signal would have.
        (signal.SIGUSR2, ""),
    ],
)
def test_a_stop_signal_before_the_task_listens_is_held_for_it(
    tmp_path: Path, signum: signal.Signals, said: str, blocked: bool
) -> None:
    launcher, entry = (_BLOCKED, _BLOCKED_ENTRY) if blocked else ((), _ENTRY)
    ran = subprocess.run(
        [
            *launcher, sys.executable, "-c", entry.format(name=signum.name),
            f"--output_root={tmp_path}", *TRAIN_LONG,
        ],
        env={**os.environ, **fake_backend.environ()}, capture_output=True, text=True,
        cwd=REPOSITORY, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == (0 if said else -signum), ran.stderr[-3000:]
    assert said in ran.stderr
    if said:
        assert checkpoint_step(tmp_path / "paced") == 0


def test_a_local_cluster_s_launcher_told_to_stop_as_it_starts_starts_no_task(
    tmp_path: Path,
) -> None:
    """A launcher whose stop was held as it started has not heard of it where it starts its
    tasks (its own handlers come later): it starts none, where its tasks trained on."""
    ran = subprocess.run(
        [
            sys.executable, "-c", _ENTRY.format(name="SIGTERM"), f"--output_root={tmp_path}",
            *TRAIN_LONG, "--local_cluster=ps=1,workers=1",
        ],
        env={**os.environ, **fake_backend.environ()}, capture_output=True, text=True,
        cwd=REPOSITORY, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 128 + signal.SIGTERM, ran.stderr[-3000:]
    assert "SIGTERM: told to stop before any task started; none is" in ran.stderr
    assert "started chief" not in ran.stderr

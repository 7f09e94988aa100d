"""A task killed mid-training ends the whole job fast, with a non-zero exit, and the log
names the task that died: on the real SLURM cluster (where srun without --kill-on-bad-exit
would otherwise wait for the hung survivors forever) and in --local_cluster mode."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.cli import REPOSITORY
from tests.slurm_cluster import NODES, SlurmCluster

pytestmark = pytest.mark.tensorflow

# Every fault must end the job within this; a hang is what the test exists to catch.
END_SECONDS = 60.0
# Starting four TensorFlow processes on 2 cores and reaching the first steps.
START_SECONDS = 180.0
TRAIN_FOREVER = ("--experiment=mnist_deep", "--train_steps=1000000", "--log_every_steps=10")


def wait_for(read: Callable[[], str], pattern: str, seconds: float) -> re.Match[str]:
    """Polls `read()` until `pattern` appears in what it returns."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = re.search(pattern, read())
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"no {pattern!r} within {seconds:.0f} s:\n{read()[-3000:]}")


def read_all(folder: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted(folder.glob("*.log")))


def ended_within(process: subprocess.Popen[Any], seconds: float) -> float:
    started = time.monotonic()
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the job still ran {seconds:.0f} s after the kill: it hangs")
    return time.monotonic() - started


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("rank", "victim"), [(2, "ps 1 at node2:"), (3, "worker 0 at node2:"), (1, "chief 0 at node1:")]
)
def test_a_killed_task_ends_the_step_and_is_named(
    slurm_cluster: SlurmCluster, tmp_path: Path, rank: int, victim: str
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    step = subprocess.Popen(
        # No --kill-on-bad-exit: SLURM then waits for every task, so the runtime must end them.
        [
            *("srun", "--nodes=2", "--ntasks-per-node=2", "--gres=gpu:1"),
            f"--output={logs}/%t.log",
            *(sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={tmp_path}"),
            *TRAIN_FOREVER,
        ],
        env=slurm_cluster.environ(),
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: read_all(logs), r"(?s)first step done.*first step done", START_SECONDS)
        pid = slurm_cluster.task_pid(rank)
        os.kill(pid, signal.SIGKILL)
        took = ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    survivors = read_all(logs)
    assert step.returncode != 0
    assert re.search(rf"{victim}\d+ has not answered for \d+ s", survivors), survivors[-3000:]
    assert took < END_SECONDS
    assert slurm_cluster.task_pids() == {node: [] for node in NODES}


@pytest.mark.parametrize("victim", ["ps 0", "worker 1", "chief 0"])
def test_a_killed_local_task_ends_the_cluster_and_is_named(tmp_path: Path, victim: str) -> None:
    console = tmp_path / "console.log"
    with console.open("w") as output:
        cluster = subprocess.Popen(
            [
                *(sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={tmp_path}"),
                "--local_cluster=ps=1,workers=2",
                *TRAIN_FOREVER,
            ],
            cwd=REPOSITORY,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(console.read_text, r"(?s)first step done.*first step done", START_SECONDS)
        pid = int(wait_for(console.read_text, rf"started {victim} at \S+ \(pid (\d+)\)", 1)[1])
        os.kill(pid, signal.SIGKILL)
        ended_within(cluster, END_SECONDS)
    finally:
        if cluster.poll() is None:
            cluster.kill()
    assert cluster.returncode == 1
    assert f"{victim} (pid {pid}) was killed by SIGKILL" in console.read_text()

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
from tests.slurm_cluster import (
    NODES,
    SlurmCluster,
    checkpoint_step,
    finish,
    read_logs,
    release,
    submit,
    wait_until,
)

pytestmark = pytest.mark.tensorflow

# Every fault must end the job within this; a hang is what the test exists to catch.
END_SECONDS = 60.0
# Starting four TensorFlow processes on 2 cores and reaching the first steps.
START_SECONDS = 180.0
TRAIN_FOREVER = ("--experiment=mnist_deep", "--train_steps=1000000", "--log_every_steps=10")


def wait_for(read: Callable[[], str], pattern: str, seconds: float) -> re.Match[str]:
    """Polls `read()` until `pattern` appears in what it returns."""
    if not wait_until(lambda: re.search(pattern, read()) is not None, seconds):
        pytest.fail(f"no {pattern!r} within {seconds:.0f} s:\n{read()[-3000:]}")
    found = re.search(pattern, read())
    assert found is not None
    return found


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
        wait_for(lambda: read_logs(logs), r"(?s)first step done.*first step done", START_SECONDS)
        pid = slurm_cluster.task_pid(rank)
        os.kill(pid, signal.SIGKILL)
        took = ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    survivors = read_logs(logs)
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


@pytest.mark.slurm
def test_usr1_checkpoints_requeues_and_resumes_losing_no_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """As `#SBATCH --signal=USR1@90` warns a job before its time limit."""
    job = submit(slurm_cluster, tmp_path, "preempted", "--train_steps=200")
    logs = tmp_path / "preempted" / "logs"
    wait_for(lambda: read_logs(logs), r"(?s)first step done.*first step done", START_SECONDS)
    job_id = next(logs.glob("job*-task0.log")).name.split("-")[0].removeprefix("job")
    signalled = slurm_cluster.run(["scancel", "--signal=USR1", job_id])
    assert signalled.returncode == 0, signalled.stderr
    wait_for(
        lambda: slurm_cluster.run(["scontrol", "show", "job", job_id]).stdout,
        r"(?s)JobState=PENDING.*Restarts=1",
        END_SECONDS,
    )
    release(slurm_cluster, job_id)
    ended = finish(slurm_cluster, job)
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "1")
    log = read_logs(logs)
    stopped_at = [
        int(step) for step in re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    ]
    assert len(stopped_at) == 2  # the chief and the worker, each at a step boundary
    assert f"requeued job {job_id} (restart 1 of at most 3)" in log
    resumed = re.findall(r"chief 0 on node1 .* resuming from step (\d+)", log)
    assert resumed == [str(max(stopped_at))]  # every step taken before the signal is kept
    assert checkpoint_step(tmp_path / "preempted") >= 200


@pytest.mark.slurm
def test_a_node_cut_off_ends_the_job_in_bounded_time(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Its link down, as a switch port failing: bounded by SlurmdTimeout (30 s) + 60 s."""
    job = submit(slurm_cluster, tmp_path, "cut", *TRAIN_FOREVER[1:], nodes="node[1-2]")
    logs = tmp_path / "cut" / "logs"
    try:
        wait_for(lambda: read_logs(logs), r"(?s)first step done.*first step done", START_SECONDS)
        job_id = next(logs.glob("job*-task0.log")).name.split("-")[0].removeprefix("job")
        subprocess.run(["ip", "link", "set", "tfsveth2", "down"], check=True)
        cut = time.monotonic()
        ended = wait_until(lambda: slurm_cluster.run_ended(job_id), 30.0 + END_SECONDS)
        took = time.monotonic() - cut
        state = slurm_cluster.job(job_id)
    finally:
        subprocess.run(["ip", "link", "set", "tfsveth2", "up"], check=True)
        slurm_cluster.run(["scontrol", "update", "nodename=node2", "state=resume"])
        slurm_cluster.run(["scancel", "--user=root"])
        job.kill()  # the sbatch --wait client only
        job.communicate()
    assert ended, f"the job still ran {took:.0f} s after node2 was cut off"
    # launch/mnist_deep.sbatch asks for --requeue: Slurm requeues a job whose node failed.
    assert (state["JobState"], state["Restarts"]) in (("FAILED", "0"), ("PENDING", "1")), state
    # The tasks cut off with node2 ended too, by the watchdog: none hangs there.
    assert wait_until(lambda: slurm_cluster.task_pids()["node2"] == [], 30.0)

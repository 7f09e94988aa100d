"""Faults on the real SLURM test cluster, each several times: does the job end, how fast, and
how many steps does it lose?

Every run submits `launch/train.sbatch` (2 nodes x (1 ps + 1 trainer), one GPU each,
checkpoints every 20 steps), waits until both trainers train, injects the fault, and
measures:

- kill worker / kill ps / kill chief: SIGKILL of that task. Bound: the job ends, non-zero,
  within 60 s. Steps lost: the highest global step any trainer logged by the end of the
  run (the steps in flight at the fault included), less the latest checkpoint's step,
  where a resubmission resumes.
- preempt: `scancel --signal=USR1`, as `#SBATCH --signal=USR1@90` sends it. Bound: the job
  is requeued within 90 s. Steps lost: the step the trainers stopped at, less the step the
  requeued run resumes from.
- scancel: `scancel JOBID`, SIGTERM to every task (as a time limit or a preemption without
  warning sends it), SIGKILL after KillWait (30 s). Bound: every task has exited within
  those 30 s. Steps lost: the step the trainers stopped at, less the latest checkpoint's.
- node cut: node2's link down (`ip link set tfsveth2 down`). Bound: the job ends, non-zero,
  within SlurmdTimeout (30 s) + 60 s. Steps lost as for a kill. The link and node are
  restored after each run.

A run that outlives its bound is a hang. Needs root and the test cluster (it starts it).

  .venv/bin/python bench/faults.py [--runs 5] [--faults kill_worker,preempt]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cli import checkpoint_step, highest_step, read_logs, wait_until
from tests.slurm_cluster import SCRIPT, STATE, TRAINING, SlurmCluster, job_id_of, release, submit

# The step's ranks: node1 runs ps 0 (rank 0) and the chief (1), node2 ps 1 (2), worker 0 (3).
_VICTIMS = {"kill_worker": 3, "kill_ps": 2, "kill_chief": 1}
_BOUNDS = {"kill_worker": 60.0, "kill_ps": 60.0, "kill_chief": 60.0, "preempt": 90.0}
_BOUNDS["node_cut"] = 30.0 + 60.0
_BOUNDS["scancel"] = 30.0
_START_SECONDS = 300.0


class Outcome(NamedTuple):
    seconds: float | None  # None: still not ended at the bound (a hang)
    steps_lost: int | None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default=",".join([*_VICTIMS, "preempt", "scancel", "node_cut"]))
    args = parser.parse_args()
    subprocess.run([str(SCRIPT), "up"], check=True)
    cluster = SlurmCluster(STATE / "slurm.conf")
    rows = []
    for fault in args.faults.split(","):
        outcomes = []
        for run in range(args.runs):
            with tempfile.TemporaryDirectory(prefix=f"faults-{fault}-") as folder:
                outcome = _run(cluster, Path(folder), fault)
            print(f"{fault} run {run + 1}: {outcome}", flush=True)
            outcomes.append(outcome)
        rows.append(_row(fault, outcomes))
    print("\n| fault | runs | ended within bound | seconds (max) | max steps lost | hangs |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(row)


def _row(fault: str, outcomes: list[Outcome]) -> str:
    ended = [outcome.seconds for outcome in outcomes if outcome.seconds is not None]
    # A negative difference means only that the last steps' log lines were lost: none lost.
    lost = [max(outcome.steps_lost, 0) for outcome in outcomes if outcome.steps_lost is not None]
    return (
        f"| {fault} | {len(outcomes)} | {len(ended)} of {len(outcomes)} "
        f"(<= {_BOUNDS[fault]:.0f} s) | {max(ended, default=float('nan')):.1f} "
        f"| {max(lost, default='-')} | {len(outcomes) - len(ended)} |"
    )


def _run(cluster: SlurmCluster, folder: Path, fault: str) -> Outcome:
    # Every trainer logs its global step at every step, so that the last step reached before
    # the fault is known to within the steps in flight.
    job = submit(
        cluster,
        folder,
        "bench",
        "--train_steps=1000000",
        "--save_checkpoints_steps=20",
        "--log_every_steps=1",
    )
    logs = folder / "bench" / "logs"
    try:
        if not wait_until(lambda: re.search(TRAINING, read_logs(logs)) is not None, _START_SECONDS):
            raise RuntimeError(f"the job did not start training:\n{read_logs(logs)[-3000:]}")
        time.sleep(3.0)  # a few checkpoint intervals into training
        job_id = job_id_of(logs)
        if fault == "preempt":
            return _preempt(cluster, job_id, logs)
        if fault == "scancel":
            return _scancel(cluster, job_id, logs, folder / "bench")
        if fault == "node_cut":
            subprocess.run(["ip", "link", "set", "tfsveth2", "down"], check=True)
        else:
            os.kill(cluster.task_pid(_VICTIMS[fault]), signal.SIGKILL)
        injected = time.monotonic()
        ended = wait_until(lambda: cluster.run_ended(job_id), _BOUNDS[fault])
        seconds = time.monotonic() - injected if ended else None
        # Steps logged after the fault (in flight when it hit) were never checkpointed either.
        return Outcome(seconds, highest_step(read_logs(logs)) - checkpoint_step(folder / "bench"))
    finally:
        if job.poll() is None:
            job.kill()
        cluster.run(["scancel", "--full", "--user=root"])
        if fault == "node_cut":
            subprocess.run(["ip", "link", "set", "tfsveth2", "up"], check=True)
            cluster.run(["scontrol", "update", "nodename=node2", "state=resume"])
        wait_until(
            lambda: all(
                state == "idle"
                for state in cluster.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split()
            ),
            120.0,
        )


def _preempt(cluster: SlurmCluster, job_id: str, logs: Path) -> Outcome:
    signalled = time.monotonic()
    cluster.run(["scancel", "--signal=USR1", job_id])

    if not wait_until(lambda: cluster.job(job_id)["Restarts"] == "1", _BOUNDS["preempt"]):
        return Outcome(None, None)
    seconds = time.monotonic() - signalled
    release(cluster, job_id)
    resuming = re.compile(r"chief 0 on \S+ .* resuming from step (\d+)")
    if not wait_until(lambda: resuming.search(read_logs(logs)) is not None, _START_SECONDS):
        return Outcome(seconds, None)
    log = read_logs(logs)
    stopped = max(
        int(step) for step in re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    )
    resumed = int(resuming.findall(log)[0])
    return Outcome(seconds, stopped - resumed)


def _scancel(cluster: SlurmCluster, job_id: str, logs: Path, model_dir: Path) -> Outcome:
    cancelled = time.monotonic()
    cluster.run(["scancel", job_id])
    if not wait_until(lambda: not any(cluster.task_pids().values()), _BOUNDS["scancel"]):
        return Outcome(None, None)
    seconds = time.monotonic() - cancelled
    stopped = re.findall(r"stopping on SIGTERM at global step (\d+)", read_logs(logs))
    if not stopped:
        return Outcome(seconds, None)
    return Outcome(seconds, max(map(int, stopped)) - checkpoint_step(model_dir))


if __name__ == "__main__":
    main()

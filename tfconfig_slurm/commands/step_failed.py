"""A batch script's lines for a job step that failed: the first task to fail, and whether the
step starts again in the same job (exit status 75) or the job ends (0):

  tfconfig-slurm step-failed --run_dir=DIR --status=N --srun_log=FILE [--started=SECONDS]
      [--restarts=N --restarts_allowed=N] [--job_name=NAME]

The first to fail comes from the run's failure records of this job and its requeue since the
step started (process/failure.py: the task, its node and its error, or the watcher that found
it lost); where there is none (the step ended before any task or watcher could say), from
srun's own message, kept in --srun_log, and the task log of the rank it names, in the run's
logs/ (launch/train.sbatch's). Where no code of the user's failed (process/restarts.py) and
fewer than --restarts_allowed restarts were made (the runtime's --max_restarts), the step is
worth starting again: the run resumes from its latest checkpoint. Its flags are named apart
from the other commands' (--run_dir, not --model_dir): tests import them all at once.
Imports no TensorFlow.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from absl import flags

from tfconfig_slurm.cluster.step import SlurmJob, read_slurm_job
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import failure, history, reports, restarts
from tfconfig_slurm.process.run_dir import RunDir

PROGRAM = "tfconfig-slurm step-failed"
# The exit status that asks the batch script to start the step again (sysexits' EX_TEMPFAIL).
START_AGAIN = 75

RUN_DIR = flags.DEFINE_string("run_dir", None, "The run's model directory.")
STATUS = flags.DEFINE_integer("status", None, "The step's exit status (srun's).")
SRUN_LOG = flags.DEFINE_string("srun_log", None, "Where srun's own messages were kept.")
STARTED = flags.DEFINE_float(
    "started",
    0.0,
    "When the step started (seconds since the epoch): only the failures recorded since are "
    "its own (0: every one of the job's).",
)
RESTARTS = flags.DEFINE_integer(
    "restarts", 0, "Restarts of the step made so far in this job.", lower_bound=0
)
RESTARTS_ALLOWED = flags.DEFINE_integer(
    "restarts_allowed",
    0,
    "Restarts of the step the job may make (the runtime's --max_restarts).",
    lower_bound=0,
)
JOB_NAME = flags.DEFINE_string("job_name", "train", "How the lines name the job (its name).")

# A task's own first line says its role: "worker 0 on node2 at node2:10001 ...".
_ROLE = re.compile(r"(chief|worker|ps|evaluator) [0-9]+ on [^ ]+")


class Step(NamedTuple):
    """The step that failed, as the run and srun left it: its exit status, when it started,
    its first failure recorded since (None: none), and srun's messages."""

    status: int
    started: float
    first: failure.Failure | None
    srun_said: str


def read_step(model_dir: Path, job: SlurmJob, status: int, srun_log: Path, started: float) -> Step:
    """The step of `job` (in its run since its last requeue) that ended with `status`, read
    once: its failure records since `started`, and srun's messages kept in `srun_log`."""
    first = failure.of_job(model_dir, job.job_id, job.restart_count, started)
    return Step(status, started, first, _text(srun_log))


def line(model_dir: Path, job: SlurmJob, step: Step, job_name: str) -> str:
    """The line that names the first task of `job`'s `step` to fail."""
    logs = RunDir(model_dir).logs
    failed = f"{job_name}: the step failed (exit {step.status})"
    if step.first is not None:
        return f"{failed}; first to fail: {step.first.line()}; task logs in {logs}"
    named = restarts.first_task_said(step.srun_said)
    if named is None:
        srun_last = step.srun_said.strip().splitlines()[-1:] or [""]
        return (
            f"{failed} with no task named: srun's own last line: {srun_last[0]}; task logs in "
            f"{logs}"
        )
    task_log = _text(logs / f"job{job.name}-task{named[1]}.log")
    role = _ROLE.search(task_log)
    # Its own last line, not slurmstepd's: a task that refused its input said why there.
    own = [each for each in task_log.splitlines() if not each.startswith("slurmstepd")]
    return (
        f"{failed}; first to fail: {named[0]}{f' ({role[0]})' if role else ''}"
        f"{f'; its last line: {own[-1]}' if own else ''}; task logs in {logs}"
    )


def decision(
    model_dir: Path, job: SlurmJob, step: Step, *, done: int, most: int, job_name: str
) -> tuple[str, bool]:
    """The line that says whether the step starts again (`done` restarts made of at most
    `most`), and whether it does; ("", False) where the job makes none."""
    if most <= 0:
        return "", False
    # A restart that failed before its first progress line would fail so again.
    logged = reports.read_json(RunDir(model_dir).progress).get("time")
    trained = done == 0 or (isinstance(logged, (int, float)) and logged >= step.started)
    judged = restarts.verdict(step.first, step.srun_said, trained=trained)
    if not judged.again:
        return f"{job_name}: not starting the step again: {judged.why}", False
    if done >= most:
        return (
            f"{job_name}: not starting the step again: {judged.why}, and the job made its "
            f"{most} restart(s) (--max_restarts)"
        ), False
    step_now = history.checkpoint_step(model_dir)
    reports.record_restart(model_dir, job.name, judged.why)
    return (
        f"{job_name}: starting the step again in job {job.name} (restart {done + 1} of at most "
        f"{most}), from {f'the checkpoint of step {step_now}' if step_now else 'step 0'}: "
        f"{judged.why}"
    ), True


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def main(argv: Sequence[str]) -> int:
    del argv
    for flag in (RUN_DIR, STATUS, SRUN_LOG):
        if flag.value is None:
            raise UsageError(f"--{flag.name}", "is required", "launch/train.sbatch shows the call")
    job = read_slurm_job(os.environ)
    if job is None:
        raise UsageError(
            "SLURM_JOB_ID", "is not set: this is no batch job", "call it from a batch script"
        )
    model_dir = Path(RUN_DIR.value or "")
    step = read_step(model_dir, job, STATUS.value or 0, Path(SRUN_LOG.value or ""), STARTED.value)
    sys.stderr.write(f"{line(model_dir, job, step, JOB_NAME.value)}\n")
    said, again = decision(
        model_dir, job, step, done=RESTARTS.value, most=RESTARTS_ALLOWED.value,
        job_name=JOB_NAME.value,
    )  # fmt: skip
    if said:
        sys.stderr.write(f"{said}\n")
    return START_AGAIN if again else 0


def run() -> None:
    run_cli(PROGRAM, main)

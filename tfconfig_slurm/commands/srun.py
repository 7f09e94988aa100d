"""`tfconfig-slurm srun`: a batch script's job step, started again in the same job where it
failed and no code of the run's did.

  tfconfig-slurm srun --model_dir=DIR [--max_restarts=2] -- [srun's options] COMMAND [ARGS]

Runs srun with what follows `--`. Where the step fails, it names the first task to fail (the
run's failure records in DIR, which with-tfconfig told the same --model_dir and the runtime
write, else srun's own message) and, where a task was killed or a peer stopped answering
rather than the run's code failing, starts the step again, on the nodes the job holds, at most
--max_restarts times: the run resumes from its latest checkpoint. An error in the run's code,
or a restart that trained nothing, ends it. Sent SIGTERM, SIGINT or SIGHUP (scancel, a
requeue, the time limit), it lets the step end and starts nothing; SIGUSR1 and SIGUSR2 (as
`#SBATCH --signal=B:USR1@90` sends them) it passes on to srun, which passes them on to the
tasks. Its exit status is the last step's.

A node that fails: in a job submitted with --no-kill, SLURM keeps the job on the nodes left,
and the step starts again there, laid out for them (a restart too). Otherwise SLURM ends the
job and requeues it where it may (sbatch --requeue); where it may not (Requeue=0), the run
goes on in a new job of as many nodes without the one that failed, its batch script submitted
again (at most --max_restarts such jobs). More in docs/slurm.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from absl import flags

from tfconfig_slurm.cluster.step import Allocation, SlurmJob, read_job_allocation, read_slurm_job
from tfconfig_slurm.commands import max_restarts_flag, model_dir_flag
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import ExitStatus, SlurmEnvironmentError, UsageError
from tfconfig_slurm.process import exits
from tfconfig_slurm.process.job import preemption, restarts, what_follows
from tfconfig_slurm.process.records import attempts, history

PROGRAM = "tfconfig-slurm srun"
_USAGE = f"{PROGRAM} --model_dir=DIR -- [srun's options] launch/with-tfconfig python my_script.py"
# srun's and slurmstepd's own lines in srun's stderr, which name a failed task (a task's own
# output reaches it too, where srun is given no --output).
_SRUN_LINES = (b"srun:", b"slurmstepd")

flags.adopt_module_key_flags(model_dir_flag)
flags.adopt_module_key_flags(max_restarts_flag)


class _Signals:
    """What the batch script is sent while a step runs: a stop (the step gets it from SLURM
    too), or SIGUSR1/SIGUSR2 passed on to srun, whose default action would end this process
    and leave the step behind."""

    def __init__(self) -> None:
        self.stop = preemption.StopRequest()
        self.srun: subprocess.Popen[bytes] | None = None
        for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(each, lambda number, _: self.stop.note_signal(number))
        for each in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(each, self._passed_on)

    def _passed_on(self, number: int, frame: FrameType | None) -> None:
        del frame
        if self.srun is not None and self.srun.returncode is None:
            self.srun.send_signal(number)


def main(argv: Sequence[str]) -> int:
    srun_args = list(argv[1:])
    if not srun_args:
        raise UsageError("COMMAND", "missing: nothing to run in the step", _USAGE)
    if not model_dir_flag.MODEL_DIR.value:
        raise UsageError("--model_dir", "is required: the run's records are read there", _USAGE)
    job = read_slurm_job(os.environ)
    if job is None:
        raise UsageError(
            "SLURM_JOB_ID",
            "is not set: this is no batch job",
            f"call it from a batch script: {_USAGE}",
        )
    if shutil.which("srun") is None:
        raise UsageError("srun", "is not on PATH", "call it from a batch script on the cluster")
    directory = model_dir_flag.made()
    try:
        held: Allocation | None = read_job_allocation(os.environ)
    except SlurmEnvironmentError as error:
        # Only a node's failure needs what the job holds: said, not refused.
        _say(f"{PROGRAM}: {error.culprit}: {error.problem}; a node that fails is not handled")
        held = None
    return _steps(
        directory,
        job,
        held,
        # By its name, not the path found: srun names itself as called in its own lines
        # ("srun: unrecognized option"), which the step's end reads by that name.
        ["srun", *srun_args],
        max_restarts_flag.MAX_RESTARTS.value,
    )


def _steps(
    model_dir: Path, job: SlurmJob, held: Allocation | None, command: list[str], most: int
) -> int:
    """Runs the step until it succeeds, is stopped, or is not worth starting again; `held`
    is what the job holds (None: unknown, as in a heterogeneous job)."""
    signals = _Signals()
    environ: dict[str, str] | None = None
    # A step srun's options size by nodes or tasks cannot start again on fewer nodes.
    sized = restarts.sized_by(command[1:])
    # Counted here, in memory, for this call's steps: a count in the run's state.json, which
    # a task on another node rewrites whole, may read stale on a network file system.
    done = 0
    while True:
        started = time.time()
        at_start = history.checkpoint_step(model_dir)
        progress_at_start = restarts.progress_mark(model_dir)
        status, srun_said, left = _step(command, signals, job, held, environ, watch=not sized)
        if signals.stop.requested and held is not None:
            _stopped_by_slurm(signals, model_dir, job, held, most)
            return status
        if status == 0:
            return status
        if status == ExitStatus.NOT_REQUEUED and restarts.stopped_unrequeued(model_dir, job):
            _say(f"{PROGRAM}: the run stopped and was not requeued (exit {status}): the step is "
                 "not started again")  # fmt: skip
            return status
        said, cause, refused = "", None, False
        if not signals.stop.requested:
            step = restarts.read_step(
                model_dir, job, status=status, started=started, checkpoint_at_start=at_start,
                srun_said=srun_said, progress_at_start=progress_at_start,
            )  # fmt: skip
            _say(restarts.line(model_dir, job, step, PROGRAM, left))
            refused = restarts.refused(step)
            said, cause = what_follows.after_failure(
                model_dir, job, step, done=done, most=most, who=PROGRAM, left=left
            )
        # Asked again after the decision, which reads the run's files: a stop meanwhile wins.
        if _said_stopped(signals):
            return status
        if left and sized:
            cause = None
            said = (
                f"{PROGRAM}: not starting the step again on the nodes left: srun's option "
                f"{sized} sizes it for the nodes it had. HINT: leave the step's nodes and "
                "tasks to the allocation (--ntasks-per-node is kept)"
            )
        if said:
            _say(said)
        if cause is None:
            # Bad input ends the job with its status, not srun's of the tasks it then killed.
            return ExitStatus.REFUSED if refused else status
        attempts.record(model_dir, job, cause)
        done += 1
        if left and held is not None:
            held = held.keeping([node for node in held.nodes if node not in left])
            environ = held.step_environment(os.environ)
        # Told to stop as the restart was said: the step is not started after all.
        if _said_stopped(signals):
            return status


def _stopped_by_slurm(
    signals: _Signals, model_dir: Path, job: SlurmJob, held: Allocation, most: int
) -> None:
    """Slurm's own stop, where a node of the job failed: said, and the run continued in a
    new job where Slurm may not requeue this one."""
    _said_stopped(signals)
    node = what_follows.after_node_failure(model_dir, job, held, os.environ, most)
    if node:
        _say(f"{PROGRAM}: {node}")


def _step(
    command: list[str],
    signals: _Signals,
    job: SlurmJob,
    held: Allocation | None,
    environ: dict[str, str] | None,
    *,
    watch: bool,
) -> tuple[int, str, tuple[str, ...]]:
    """Runs srun in `environ` (None: this process's): its exit status, its own lines (passed
    through to stderr) and the nodes of `held` that left the job meanwhile, which, where it
    `watch`es, end srun, which would wait on for their tasks."""
    kept = []
    with subprocess.Popen(command, stderr=subprocess.PIPE, env=environ) as srun:
        signals.srun = srun
        watching = restarts.NodeWatch(job, held.nodes if held else (), srun)
        assert srun.stderr is not None
        for each in srun.stderr:
            sys.stderr.buffer.write(each)
            sys.stderr.flush()
            if each.startswith(_SRUN_LINES):
                kept.append(kept_line := each.decode(errors="replace"))
                if watch and held is not None and restarts.ended(kept_line):
                    watching.noticed()
    left = watching.left
    # srun may end of itself once SLURM told it of the node's failure. Told to stop, the
    # caller asks once itself (what_follows.after_node_failure).
    if not left and srun.returncode != 0 and held is not None and not signals.stop.requested:
        left = restarts.gone(held.nodes, restarts.nodes_now(job))
    return exits.exit_status(srun.returncode), "".join(kept), left


def _said_stopped(signals: _Signals) -> bool:
    """Whether the batch script was told to stop; said where it was."""
    if not signals.stop.requested:
        return False
    _say(f"{PROGRAM}: told to stop ({signals.stop.signal_name}): the step is not started again")
    return True


def _say(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def run() -> None:
    run_cli(
        PROGRAM, main, stop_at_first_argument=True, usage=f"srun's options come after --: {_USAGE}"
    )

"""Whether a failed job step is worth starting again in the same job, and the lines that say
so: where no code of the user's failed (a task killed, a peer that stopped answering), a
restart loses at most a checkpoint interval; where it did, or the cause is unknown, the same
failure would come again. And a node that left the job: where a node of a `--no-kill` job
fails, srun waits on for its tasks, and only the job's record says that it is gone;
`NodeWatch` ends srun then, for the step to start again on the nodes left. No TensorFlow
here."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import hostlist

from tfconfig_slurm.cluster.step import Allocation, SlurmJob, expand_nodes
from tfconfig_slurm.errors import ExitStatus, SlurmEnvironmentError
from tfconfig_slurm.process import slurm_commands, timing
from tfconfig_slurm.process.job import continuation
from tfconfig_slurm.process.records import failure, reports
from tfconfig_slurm.process.records.failure import Failure
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.records.run_dir import RunDir

# srun's line of a task's end: its node, rank and how it ended ("node2: tasks 3-5: Killed").
_SRUN_TASK = re.compile(r"[^ \n]+: tasks? ([0-9]+)[-,0-9]*: (.*)")
# The out-of-memory killer, as slurmstepd or srun reports it.
_OOM_KILL = re.compile(r"oom[-_ ]kill|out of memory", re.I)
# A crash signal (strsignal's words) would come again, whatever the peers recorded of it.
_CRASH = re.compile(
    r"tasks? [0-9][-,0-9]*: (Segmentation fault|Aborted|Bus error|Illegal instruction|"
    r"Floating point exception)"
)
# A task's own first line says its role: "worker 0 on node2 at node2:10001 ...".
_ROLE = re.compile(r"(chief|worker|ps|evaluator) [0-9]+ on [^ ]+")


class Verdict(NamedTuple):
    """Whether to start the step again, and why (for the batch script's line)."""

    again: bool
    why: str


class Step(NamedTuple):
    """A step that failed, as the run and srun left it."""

    status: int
    started: float
    checkpoint_at_start: int | None
    first: Failure | None
    srun_said: str
    progress_at_start: object = None


def refused(step: Step) -> bool:
    """Whether the step's first failure was a task refusing its input (exit 2), as its record
    or, where none was written, srun's first line of a task says."""
    if step.first is not None:
        return step.first.exit_status == ExitStatus.REFUSED and step.first.seen_by is None
    named = _SRUN_TASK.search(step.srun_said)
    return named is not None and named[2].strip() == f"Exited with exit code {ExitStatus.REFUSED}"


def verdict(first: Failure | None, srun_said: str, *, trained: bool) -> Verdict:
    """What the step's first failure (its record, else srun's messages) says of a restart."""
    if not trained:
        return Verdict(again=False, why="it failed before it trained a step")
    crashed = _CRASH.search(srun_said)
    if crashed:
        return Verdict(again=False, why=f"a task crashed ({crashed[1]}): it would crash again")
    return _of_record(first) if first is not None else _of_srun(srun_said)


def _of_srun(srun_said: str) -> Verdict:
    if _OOM_KILL.search(srun_said):
        return Verdict(again=True, why="the out-of-memory killer ended a task")
    # The first task srun names: those it killed after it (--kill-on-bad-exit) say nothing.
    named = _SRUN_TASK.search(srun_said)
    if named is None:
        return Verdict(again=False, why="srun names no task that failed (see its lines above)")
    if named[2].strip() == "Killed":
        return Verdict(again=True, why="a task was killed")
    # Not "of themselves": a signal the task did not catch ends it too (User defined signal 1).
    return Verdict(
        again=False, why=f"srun names no task killed, only one that ended: {named[2].strip()}"
    )


def read_step(
    model_dir: Path,
    job: SlurmJob,
    *,
    status: int,
    started: float,
    checkpoint_at_start: int | None,
    srun_said: str,
    progress_at_start: object = None,
) -> Step:
    """The step of `job` that ended, with its first failure recorded since it `started`."""
    first = failure.of_job(model_dir, job.job_id, job.restart_count, started)
    return Step(status, started, checkpoint_at_start, first, srun_said, progress_at_start)


def progress_mark(model_dir: Path) -> object:
    """What the run's progress.json holds now, for a step to compare once it ends."""
    return reports.read_json(RunDir(model_dir).progress)


def stopped_unrequeued(model_dir: Path, job: SlurmJob) -> bool:
    """Whether the run says that this attempt of `job` stopped: a command of the user's that
    exits with ExitStatus.NOT_REQUEUED stopped nothing, and failed."""
    state = reports.read_state(model_dir)
    return (
        state.get("state") == RunState.STOPPED
        and state.get("job_id") == job.name
        and state.get("restart", 0) == job.restart_count
    )


def line(model_dir: Path, job: SlurmJob, step: Step, who: str, left: Sequence[str] = ()) -> str:
    """The line that names the first task of `step` to fail, or the nodes that `left` the job
    (their tasks, cut off, may have recorded their peers as lost first)."""
    logs = RunDir(model_dir).logs
    # A batch script that names no task logs (srun --output) has none there.
    where = f"; task logs in {logs}" if logs.is_dir() else ""
    failed = f"{who}: the step failed (exit {step.status})"
    if left:
        return f"{failed}: {nodes_named(left)} left job {job.name}: its node failed{where}"
    if step.first is not None:
        return f"{failed}; first to fail: {step.first.line()}{where}"
    named = _SRUN_TASK.search(step.srun_said)
    if named is None:
        last = step.srun_said.strip().splitlines()[-1:]
        said = f": srun's own last line: {last[0]}" if last else ", nor any line of srun's"
        return f"{failed} with no task named{said}{where}"
    try:
        task_log = (logs / f"job{job.name}-task{named[1]}.log").read_text(errors="replace")
    except OSError:
        task_log = ""
    role = _ROLE.search(task_log)
    # Its own last line, not slurmstepd's: a task that refused its input said why there.
    own = [each for each in task_log.splitlines() if not each.startswith("slurmstepd")]
    # A task that never ran (a command not found): its node's slurmstepd says why.
    node = named[0].partition(":")[0]
    stepd = [
        each
        for each in step.srun_said.splitlines()
        if each.startswith(f"slurmstepd-{node}: error: ") and "***" not in each
    ]
    why = f"; its last line: {own[-1]}" if own else f"; {stepd[-1]}" if stepd else ""
    return f"{failed}; first to fail: {named[0]}{f' ({role[0]})' if role else ''}{why}{where}"


def _of_record(first: Failure) -> Verdict:
    # A watcher recorded the task lost (killed, or its node cut off), not failed.
    if (
        first.seen_by is not None
        and first.exit_status is None
        and first.what.startswith(failure.STOPPED_ANSWERING)
    ):
        return Verdict(again=True, why=f"{first.task} stopped answering")
    if first.hung_at() is not None:
        # A stalled file system or a lost packet may pass (the same step hung again: no).
        return Verdict(again=True, why=f"{first.task} {failure.HUNG}{first.hung_at()}")
    if first.seen_by is not None:
        # A peer that said its command failed: the command's own error.
        return Verdict(again=False, why=f"{first.task}'s command failed")
    # SIGKILL, as by a person or the out-of-memory killer: unlike a crash, it may not recur.
    if first.what == "its command was killed by SIGKILL":
        return Verdict(again=True, why=f"{first.task} was killed by SIGKILL")
    if first.exit_status == ExitStatus.REFUSED:
        return Verdict(again=False, why="its input was refused")
    return Verdict(again=False, why="an error in the run's code")


def nodes_named(nodes: Sequence[str]) -> str:
    """`nodes` as a hostlist."""
    return str(hostlist.collect_hostlist(list(nodes)))


def nodes_now(job: SlurmJob) -> tuple[str, ...] | None:
    """The nodes `job` holds now, as slurmctld says; None where it cannot say."""
    return nodes_of(continuation.job_record(job.name))


def nodes_of(record: Mapping[str, str] | str) -> tuple[str, ...] | None:
    """The nodes a job's record lists; None where there is none, or it lists none."""
    return None if isinstance(record, str) else _expanded(record.get("NodeList", "")) or None


def gone(held: Sequence[str], now: Sequence[str] | None) -> tuple[str, ...]:
    """The nodes of `held` that the job no longer holds."""
    return () if now is None else tuple(node for node in held if node not in set(now))


def down(nodes: Sequence[str]) -> tuple[str, ...]:
    """Those of `nodes` that Slurm says failed: down, failed, or not responding (`*`)."""
    if not nodes:
        return ()
    shown = slurm_commands.run(["scontrol", "show", "node", hostlist.collect_hostlist(list(nodes))])
    if shown is None or shown.returncode != 0:
        return ()
    records = map(continuation.parse_record, re.split(r"\n\s*\n", shown.stdout.strip()))
    failed = {
        record.get("NodeName")
        for record in records
        if any(word in record.get("State", "") for word in ("DOWN", "FAIL", "NOT_RESPONDING", "*"))
    }
    return tuple(node for node in nodes if node in failed)


# srun's options that size a step by nodes or tasks: srun refuses them on the nodes left.
_SIZING = ("-N", "--nodes", "-n", "--ntasks", "-w", "--nodelist")
# srun's lines that say a task ended, or a node failed: the watch starts at the first.
_ENDED = re.compile(r": tasks? [0-9][-,0-9]*: |[Nn]ode failure|NODE FAILURE")


def sized_by(srun_args: Sequence[str]) -> str | None:
    """The first of srun's options before its command that sizes the step; None where none."""
    for index, word in enumerate(srun_args):
        option = word.split("=", 1)[0]
        if option in _SIZING or (option[:2] in _SIZING and len(option) > 2 and option[1] != "-"):
            return word
        # The command: a word that is no option, nor the value of a short one before it.
        if not word.startswith("-") and not (
            index and len(srun_args[index - 1]) == 2 and srun_args[index - 1].startswith("-")
        ):
            return None
    return None


def ended(line: str) -> bool:
    """Whether srun's `line` says that a task ended or a node failed."""
    return _ENDED.search(line) is not None


class NodeWatch:
    """Once `noticed()` (srun said a task ended), watches the nodes of `job` while `srun` runs
    a step on `held`, and ends srun where one left; `left` then names them."""

    def __init__(self, job: SlurmJob, held: Sequence[str], srun: subprocess.Popen[bytes]) -> None:
        self._job = job
        self._held = tuple(held)
        self._srun = srun
        self._thread: threading.Thread | None = None
        self.left: tuple[str, ...] = ()

    def noticed(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="node-watch", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        # Often while a node's failure may still be declared (SlurmdTimeout), then seldom.
        seldom = time.monotonic() + timing.NODE_WATCH_OFTEN_SECONDS
        while self._srun.poll() is None:
            left = gone(self._held, nodes_now(self._job))
            if left and self._srun.poll() is None:
                self.left = left
                # Slurm killed the tasks on the nodes left (seen of plain `sleep` tasks).
                self._srun.kill()
                return
            often = time.monotonic() < seldom
            try:
                self._srun.wait(
                    timing.NODE_WATCH_SECONDS if often else timing.NODE_WATCH_SELDOM_SECONDS
                )
            except subprocess.TimeoutExpired:
                continue


def without(record: Mapping[str, str], held: Allocation, left: Sequence[str]) -> dict[str, str]:
    """`record`, asking for as many nodes as the job had, none of those that `left` it."""
    excluded = (*_expanded(record.get("ExcNodeList", "")), *left)
    asked = _expanded(record.get("ReqNodeList", ""))
    return {
        **record,
        "NumNodes": str(len(held.nodes)),
        "ExcNodeList": hostlist.collect_hostlist(list(dict.fromkeys(excluded))),
        "ReqNodeList": "" if set(asked) & set(left) else record.get("ReqNodeList", ""),
    }


def _expanded(nodes: str) -> tuple[str, ...]:
    """A hostlist of a job's record; none where it names none ("(null)") or is garbled."""
    if nodes in continuation.NO_VALUE:
        return ()
    try:
        return expand_nodes("scontrol's record", nodes, SlurmEnvironmentError, "")
    except SlurmEnvironmentError:
        return ()

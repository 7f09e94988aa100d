"""The first failure of a run's attempt, kept in its run directory for the batch script and
`tfconfig-slurm runs`: a task's own error, or, for one that died without a word, the first
watcher's record of it lost. A single process records nothing. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from absl import logging

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import ExitStatus, TfconfigSlurmError
from tfconfig_slurm.process import exits
from tfconfig_slurm.process.records import files
from tfconfig_slurm.process.records.run_dir import RunDir

# An error's text is cut here (_one_line).
_MAX_ERROR_CHARS = 400
# How a watcher's record of a peer it lost begins: a loss, which a restart may cure
# (process/job/restarts.py), where a peer that said its command failed is not.
STOPPED_ANSWERING = "stopped answering"
# How the record of a hung trainer begins (process/task/hang_watch.py), its step after it.
HUNG = "hung at global step "


@dataclass(frozen=True)
class Failure:
    """Which task failed first, where, and how."""

    task: str
    node: str
    what: str
    exit_status: int | None
    # The watcher that found the task lost; None when the task said it itself.
    seen_by: str | None
    time: float

    def hung_at(self) -> int | None:
        """The global step a hung trainer made no step after; None for another failure."""
        if not self.what.startswith(HUNG):
            return None
        step = self.what[len(HUNG) :].partition(":")[0]
        return int(step) if step.isdigit() else None

    def line(self) -> str:
        """One line for a person: `worker 0 on node2: ValueError: ... (exit 1)`."""
        status = "" if self.exit_status is None else f" (exit {self.exit_status})"
        seen = f", seen by {self.seen_by}" if self.seen_by else ""
        return f"{self.task} on {self.node}: {self.what}{status}{seen}"


@dataclass(frozen=True)
class _Attached:
    model_dir: Path
    role: ClusterRole
    node: str


class _Task:
    attached: _Attached | None = None


_TASK = _Task()


def attach(model_dir: Path, role: ClusterRole | None, node: str) -> None:
    """From now on this cluster task's failures, and the peers it finds lost, are recorded in
    `model_dir`: before its start checks, or its peers would record a refused port a loss."""
    if role is not None and role.run_id is not None:
        _TASK.attached = _Attached(model_dir, role, node)


@contextlib.contextmanager
def recording_errors() -> Iterator[None]:
    """Within the block, an exception is recorded as this task's failure, and passed on."""
    try:
        yield
    except Exception as error:
        status = ExitStatus.REFUSED if isinstance(error, TfconfigSlurmError) else ExitStatus.FAILED
        _record_own(describe(error), status)
        raise


def record_exit(returncode: int, why: str = "") -> None:
    """This task's command failed with `returncode`, its output saying last `why`."""
    what = f"its command failed: {why}" if why else "its command failed; its output says why"
    if returncode < 0:
        what = f"its command {exits.how_it_ended(returncode)}"
    _record_own(_one_line(what), exits.exit_status(returncode))


def _record_own(what: str, status: int) -> None:
    attached = _TASK.attached
    if attached is not None:
        own = Failure(str(attached.role.task_id), attached.node, what, status, None, time.time())
        _record(attached, own)


def record_lost(name: str, address: str, what: str) -> Failure | None:
    """`name` at `address` is lost, as `what` says; returns an earlier failure, if any."""
    attached = _TASK.attached
    if attached is None:
        return None
    node, seen_by = address.rpartition(":")[0], str(attached.role.task_id)
    lost = Failure(name, node, what, None, seen_by, time.time())
    _record(attached, lost)
    first = _read(RunDir(attached.model_dir).failure(attached.role.run_id or ""))
    return first if first is not None and first != lost else None


def record_hang(task: str, node: str, what: str) -> Failure | None:
    """The hung trainer `task`, as `what` (beginning with HUNG) says; returns the first failure."""
    attached = _TASK.attached
    if attached is None:
        return None
    this = str(attached.role.task_id)
    _record(attached, Failure(task, node, what, None, None if this == task else this, time.time()))
    return first()


def _record(attached: _Attached, failure: Failure) -> None:
    path = RunDir(attached.model_dir).failure(attached.role.run_id or "")
    with contextlib.suppress(OSError):
        # Made, as a task may fail first; not a whole tree, for a directory a typo named.
        path.parent.parent.mkdir(exist_ok=True)
        path.parent.mkdir(exist_ok=True)
        # The first failure stays.
        files.create_whole(path, json.dumps({**asdict(failure), "line": failure.line()}, indent=1))


def say_ending(first: str, status: int, *, how: str = "failed", why: str = "") -> None:
    """Logs that this task ends (exit `status`) as the run has `how` (failed, hung), `first`
    the first failure's line, `why` after it (`, as ps 0 is gone`)."""
    logging.error(
        "the run %s (first to fail: %s); ending this task (exit %d)%s", how, first, status, why
    )
    logging.flush()


def describe(error: BaseException) -> str:
    """An error as a failure's one line: its type and text, or ours as the task said it."""
    if isinstance(error, TfconfigSlurmError):
        return _one_line(error.one_line())
    return _one_line(f"{type(error).__name__}: {error}")


def _one_line(text: str) -> str:
    """An error's text as one line, cut at _MAX_ERROR_CHARS: the task's log has the rest."""
    return " ".join(text.split())[:_MAX_ERROR_CHARS]


def run_failed() -> bool:
    """Whether this task's attempt has recorded a failure (then the watchdog grants no grace)."""
    return first() is not None


def first() -> Failure | None:
    """The first failure this task's attempt recorded, if any."""
    attached = _TASK.attached
    if attached is None or attached.role.run_id is None:
        return None
    return read(attached.model_dir, attached.role.run_id)


def read(model_dir: Path, run_id: str) -> Failure | None:
    """The first failure of the attempt `run_id`, if one was recorded."""
    return _read(RunDir(model_dir).failure(run_id))


def of_job(model_dir: Path, job_id: int, restart: int, since: float = 0.0) -> Failure | None:
    """The first failure recorded since `since` by any step of the job `job_id` in its run
    `restart` (0 before its first requeue), if any."""
    records = RunDir(model_dir).failures.glob(f"{job_id}.*.{restart}.json")
    later = (failure for failure in map(_read, records) if failure and failure.time >= since)
    return min(later, key=lambda failure: failure.time, default=None)


def latest(model_dir: Path) -> Failure | None:
    """The newest attempt's first failure recorded in `model_dir`, if any."""
    records = filter(None, map(_read, RunDir(model_dir).failures.glob("*.json")))
    return max(records, key=lambda failure: failure.time, default=None)


def _read(path: Path) -> Failure | None:
    try:
        fields = json.loads(path.read_text())
        fields.pop("line", None)
        return Failure(**fields)
    except (OSError, ValueError, TypeError):
        return None

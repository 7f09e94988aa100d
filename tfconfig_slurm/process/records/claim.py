"""One model directory, one run: a run holds its model directory (run.lock) while it trains,
as two runs in one directory would resume each other's checkpoints. The holder is a SLURM job
(every task, every requeue) or, outside SLURM, a process; its lock is taken over once SLURM or
this host says it has ended, else once unrenewed for timing.STALE_SECONDS. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, TypeVar

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import slurm_commands, timing
from tfconfig_slurm.process.records import files
from tfconfig_slurm.process.records.run_dir import RunDir

T = TypeVar("T")


@dataclass(frozen=True)
class Holder:
    """Who holds a model directory: a SLURM job (`job` set), or a process on a host."""

    job: str | None
    host: str
    pid: int

    def describe(self) -> str:
        if self.job is not None:
            return f"SLURM job {self.job}"
        return f"process {self.pid} on {self.host}"

    def same_run(self, other: Holder) -> bool:
        """Whether `other` is this run: the same job (any task, any restart), or this process."""
        if self.job is not None or other.job is not None:
            return self.job == other.job
        return (self.host, self.pid) == (other.host, other.pid)


def this_holder(job: SlurmJob | None) -> Holder:
    """The holder this process claims a model directory as (`job` None outside SLURM)."""
    return Holder(job=job.name if job else None, host=socket.gethostname(), pid=os.getpid())


@dataclass(frozen=True)
class Claim:
    """A held model directory; `renew()` keeps it held from a thread, `release()` frees it."""

    lock: Path
    holder: Holder
    _stopped: threading.Event = field(default_factory=threading.Event)

    def renew(self) -> None:
        """Renews the lock every timing.RENEW_SECONDS from a daemon thread, until release()."""

        def keep() -> None:
            while not self._stopped.wait(timing.RENEW_SECONDS):
                with contextlib.suppress(OSError):
                    os.utime(self.lock)

        threading.Thread(target=keep, name="run-lock", daemon=True).start()

    def release(self) -> None:
        """Frees the directory, if this run still holds it."""
        self._stopped.set()
        current = _read(self.lock)
        if current is not None and current[0].same_run(self.holder):
            with contextlib.suppress(OSError):
                self.lock.unlink()


class Naming(NamedTuple):
    """How a user names a model directory, for the errors about it."""

    # The setting that chooses where it goes, and an example of a better one.
    root: str
    root_example: str
    # The setting that tells one run's directory from another's, and how to change it.
    run: str
    run_fix: str


# `python -m tfconfig_slurm.run`'s.
CLI_NAMING = Naming(
    "--output_root",
    "--output_root=/scratch/$USER/tf-output",
    "--experiment_id",
    "give this run its own --experiment_id (or EXPERIMENT_ID)",
)


def claim(model_dir: Path, holder: Holder, naming: Naming = CLI_NAMING) -> Claim:
    """Makes and holds `model_dir` for `holder`'s run (shared with its other tasks and its
    requeued job; a stale holder's taken over), or raises UsageError naming the live holder."""
    model_dir.mkdir(parents=True, exist_ok=True)
    lock, text = RunDir(model_dir).lock, json.dumps(asdict(holder))
    # Without hard links, a reader may find it empty: unreadable, which only a later run would
    # act on.
    if files.create_whole(lock, text):
        return Claim(lock, holder)
    current = _read(lock)
    if current is not None and current[0].same_run(holder):
        return Claim(lock, holder)
    if current is not None and not _gone(*current):
        _refuse(model_dir, naming, *current)
    # Gone, or unreadable (a lock cut short by a full disk): take it over.
    files.write_atomically(lock, text)
    time.sleep(timing.SETTLE_SECONDS)
    current = _read(lock)
    if current is not None and not current[0].same_run(holder):
        _refuse(model_dir, naming, *current)
    return Claim(lock, holder)


def check(model_dir: Path, holder: Holder, naming: Naming = CLI_NAMING) -> None:
    """Raises UsageError, as `claim` would, where another live run holds `model_dir`; makes
    nothing, so that a second run is refused before it loads TensorFlow."""
    current = _read(RunDir(model_dir).lock)
    if current is not None and not current[0].same_run(holder) and not _gone(*current):
        _refuse(model_dir, naming, *current)


def claimed(
    model_dir: Path,
    role: ClusterRole | None,
    naming: Naming,
    job: SlurmJob | None,
    load: Callable[[], T],
) -> tuple[T, Claim | None]:
    """The model directory claimed for this task: refused at once where another live run holds
    it, then `load()` (which may refuse the run before anything is written), then made and
    held. Returns what `load` returned, and the claim this task renews and releases, if any."""
    # A --local_cluster's task holds none (its launcher holds it), nor outside SLURM any but
    # the chief, which alone can tell its run from another.
    unheld = role is not None and (role.in_local_cluster or (role.role != CHIEF and job is None))
    holder = None if unheld else this_holder(job)
    if holder is not None:
        check(model_dir, holder, naming)
    loaded = load()
    if holder is None:
        model_dir.mkdir(parents=True, exist_ok=True)
        return loaded, None
    held = claim(model_dir, holder, naming)
    if role is not None and role.role != CHIEF:
        return loaded, None
    held.renew()
    return loaded, held


def held_by_live_run(model_dir: Path) -> bool | None:
    """Whether a live run holds `model_dir`: None when no lock is there."""
    current = _read(RunDir(model_dir).lock)
    return None if current is None else not _gone(*current)


def _refuse(model_dir: Path, naming: Naming, holder: Holder, age: float) -> None:
    raise UsageError(
        naming.run,
        f"{model_dir} is held by another run, {holder.describe()} (its lock was renewed "
        f"{age:.0f} s ago); two runs in one model directory would resume each other's "
        "checkpoints",
        f"{naming.run_fix}, or wait for that run to end; a lock whose run is gone is taken "
        f"over, at the latest {timing.STALE_SECONDS:.0f} s after it was last renewed",
    )


def _read(lock: Path) -> tuple[Holder, float] | None:
    """The lock's holder and seconds since it was renewed; None if absent or unreadable."""
    try:
        age = time.time() - lock.stat().st_mtime
        fields: dict[str, Any] = json.loads(lock.read_text())
        return Holder(job=fields["job"], host=str(fields["host"]), pid=int(fields["pid"])), age
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _gone(holder: Holder, age: float) -> bool:
    """Whether the holder's run has ended, as SLURM or this host says, else by the lock's age."""
    if holder.job is not None:
        ended = _job_ended(holder.job)
        if ended is not None:
            return ended
    elif holder.host == socket.gethostname():
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return age > timing.STALE_SECONDS


# A job in these states may still train into the directory (a requeued one waits to resume).
_LIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}


def squeue(*arguments: str) -> subprocess.CompletedProcess[str] | None:
    """`squeue --noheader ARGUMENTS`; None where squeue cannot be run."""
    return slurm_commands.run(["squeue", "--noheader", *arguments], timing.SQUEUE_SECONDS)


def _job_ended(job: str) -> bool | None:
    """Whether SLURM says the job has ended; None when it cannot be asked."""
    result = squeue("--jobs", job, "--format=%T")
    if result is None:
        return None
    if result.returncode != 0:
        # squeue refuses a job id it no longer remembers.
        return True if "Invalid job id" in result.stderr else None
    return result.stdout.strip() not in _LIVE_STATES

"""The model directory before training: checked to be writable, then held for this run
(claim.py). No TensorFlow here."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import claim
from tfconfig_slurm.process.records.run_dir import RunDir

T = TypeVar("T")

# Less than this free, a run would fail at its first checkpoint, with a partial file left.
_MIN_FREE_BYTES = 64 * 2**20
# The longest file name Linux's filesystems take, in bytes.
NAME_MAX = 255


def check_name(name: str, culprit: str) -> None:
    """Refuses a run's folder name longer than a file name may be."""
    if len(os.fsencode(name)) > NAME_MAX:
        raise UsageError(
            culprit,
            f"names a folder of {len(os.fsencode(name))} bytes, longer than the {NAME_MAX} a "
            "file name may have",
            f"give {culprit} a name of at most {NAME_MAX} bytes",
        )


def check_writable(model_dir: Path, naming: claim.Naming) -> None:
    """Fails before anything is created when the model directory cannot be made or written."""
    # Absolute: "." has no parts of its own.
    *parents, name = model_dir.absolute().parts
    check_name(name, naming.run)
    if any(len(os.fsencode(part)) > NAME_MAX for part in parents):
        raise UsageError(
            naming.root,
            f"has a folder name longer than {NAME_MAX} bytes: {model_dir.parent}",
            f"choose a directory that can exist, e.g. {naming.root_example}",
        )
    # Where this user may not look, check_room says so.
    with contextlib.suppress(PermissionError):
        if model_dir.exists() and not model_dir.is_dir():
            # The run's own name is taken by a file: another name is the fix, not another root.
            raise UsageError(
                naming.run, f"names {model_dir}, a file, not a directory", naming.run_fix
            )
    check_room(model_dir, naming)


def check_room(folder: Path, naming: claim.Naming) -> None:
    """Fails where `folder` cannot be made or written, or its disk is nearly full."""
    existing = next(path for path in (folder, *folder.parents) if _exists(path))
    problem = ""
    if not os.access(existing.parent, os.X_OK):
        problem = f"{existing} cannot be reached: {existing.parent} is not searchable"
    elif not existing.is_dir():
        problem = f"{existing} is a file, not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable"
    elif (disk := shutil.disk_usage(existing)).total == 0:
        # /proc, /sys: the kernel's views, which root may "write" but which hold no files.
        problem = f"{existing} is on a filesystem of no size (the kernel's, like /proc)"
    elif (free := disk.free) < _MIN_FREE_BYTES:
        problem = (
            f"{existing} has only {free / 2**20:.1f} MiB free, less than the "
            f"{_MIN_FREE_BYTES // 2**20} MiB a run needs to start: its first checkpoint would "
            "fail half-written"
        )
    if problem:
        raise UsageError(
            naming.root,
            f"cannot hold {folder}: {problem}",
            f"choose a writable directory with room, e.g. {naming.root_example}",
        )


def _exists(path: Path) -> bool:
    """Whether `path` exists, as far as this user can tell (then found unreachable)."""
    try:
        return path.exists()
    except PermissionError:
        return True


def export_due(model_dir: Path, name: str, *, trained: bool) -> bool:
    """Whether a run exports its model: unless it trained no step and exported already, as
    Estimator does. Every trainer answers alike, as their collective export needs."""
    exported = RunDir(model_dir).export(name)
    return trained or not (exported.is_dir() and any(exported.iterdir()))


def check_same_start(model_dir: Path, steps: Sequence[int], who: str) -> None:
    """Refuses trainers (`who`) that restored different global `steps`: unshared directories."""
    if min(steps) != max(steps):
        raise UsageError(
            "--output_root",
            f"the {who} restored different checkpoints of {model_dir} (global steps "
            f"{min(steps)} to {max(steps)}): it is not the same directory on every node",
            "put --output_root on a file system every node of the job mounts",
        )


def claimed(
    model_dir: Path,
    role: ClusterRole | None,
    naming: claim.Naming,
    job: SlurmJob | None,
    load: Callable[[], T],
) -> tuple[T, claim.Claim | None]:
    """The model directory claimed for this task: refused at once where another live run holds
    it, then `load()` (which may refuse the run before anything is written), then made and
    held. Returns what `load` returned, and the claim this task renews and releases, if any."""
    holder = _holder(role, job)
    if holder is not None:
        claim.check(model_dir, holder, naming)
    loaded = load()
    if holder is None:
        model_dir.mkdir(parents=True, exist_ok=True)
        return loaded, None
    held = claim.claim(model_dir, holder, naming)
    if role is not None and role.role != CHIEF:
        return loaded, None
    held.renew()
    return loaded, held


def _holder(role: ClusterRole | None, job: SlurmJob | None) -> claim.Holder | None:
    """Who this task holds the model directory as; None for a --local_cluster's (its launcher
    holds it) and outside SLURM any but the chief, which alone can tell its run from another."""
    if role is not None and role.in_local_cluster:
        return None
    holder = claim.this_holder(job)
    if role is not None and role.role != CHIEF and holder.job is None:
        return None
    return holder

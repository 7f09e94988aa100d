"""What a run directory already holds, said before an attempt starts, and the directories an
attempt refuses: one that cannot be written, another backend's checkpoints, another
experiment's run, one not shared by every node. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.claim import Naming
from tfconfig_slurm.process.records.run_dir import RunDir

# Less than this free, a run would fail at its first checkpoint, with a partial file left.
_MIN_FREE_BYTES = 64 * 2**20
# The longest file name Linux's filesystems take, in bytes.
NAME_MAX = 255
# The last 8 bytes of a whole TensorFlow table, as a checkpoint's index is: kTableMagicNumber.
TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")


def check_name(name: str, culprit: str) -> None:
    """Refuses a run's folder name longer than a file name may be."""
    if len(os.fsencode(name)) > NAME_MAX:
        raise UsageError(
            culprit,
            f"names a folder of {len(os.fsencode(name))} bytes, longer than the {NAME_MAX} a "
            "file name may have",
            f"give {culprit} a name of at most {NAME_MAX} bytes",
        )


def check_writable(model_dir: Path, naming: Naming) -> None:
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


def check_room(folder: Path, naming: Naming) -> None:
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


# Whose checkpoints a directory holds, by their names in TensorFlow's `checkpoint` index.
ESTIMATOR = "Estimator's"  # model.ckpt-N
TF_KERAS = "tf-keras's"  # ckpt-N
KERAS_3 = "Keras 3's"  # ckpt-N.weights.h5
_LATEST = re.compile(
    r'^model_checkpoint_path: "(?P<path>(?:.*/)?(?P<name>(?P<estimator>model\.)?ckpt-'
    r'(?P<step>\d+)(?P<keras_3>\.weights\.h5)?))"',
    re.M,
)


class Checkpoint(NamedTuple):
    """The latest checkpoint of a directory, as its index names it."""

    name: str
    step: int
    # ESTIMATOR, TF_KERAS or KERAS_3.
    written_by: str
    # As the index names it: relative to the directory, or whole.
    path: str


def latest_checkpoint(model_dir: Path) -> Checkpoint | None:
    """The directory's latest checkpoint, if its index names one that a backend of ours writes."""
    try:
        latest = _LATEST.search(RunDir(model_dir).checkpoint_index.read_text())
    except (OSError, ValueError):
        return None
    if latest is None:
        return None
    written_by = ESTIMATOR if latest["estimator"] else KERAS_3 if latest["keras_3"] else TF_KERAS
    return Checkpoint(latest["name"], int(latest["step"]), written_by, latest["path"])


def checkpoint_step(model_dir: Path) -> int | None:
    """The step of the directory's latest checkpoint; None where there is none."""
    latest = latest_checkpoint(model_dir)
    return None if latest is None else latest.step


def check_resumable(model_dir: Path, writes: str, naming: Naming) -> None:
    """Refuses a directory a backend that `writes` its checkpoints cannot resume, which it would
    otherwise start over at step 0 (another backend's) or fail on in a traceback."""
    index = RunDir(model_dir).checkpoint_index
    if not index.exists():
        return
    latest = latest_checkpoint(model_dir)
    if latest is None:
        raise UsageError(
            naming.run,
            f"names {model_dir}, whose checkpoint index {index} names no checkpoint (empty or "
            "garbled: a disk that filled while it was written?)",
            f"write its first line again, as model_checkpoint_path: \"<the latest checkpoint's "
            f'name>", to resume; or {naming.run_fix}',
        )
    if latest.written_by != writes:
        raise UsageError(
            naming.run,
            f"names {model_dir}, whose latest checkpoint ({latest.name}) is {latest.written_by}, "
            f"not {writes}: another backend trained it",
            naming.run_fix,
        )
    # Its files: Keras 3's one file, or TensorFlow's index.
    suffix = "" if latest.written_by == KERAS_3 else ".index"
    files = [model_dir / f"{path}{suffix}" for path in (latest.path, latest.name)]
    found = next((file for file in files if file.exists()), None)
    if found is None:
        raise UsageError(
            naming.run,
            f"names {model_dir}, whose checkpoint index {index} names {latest.name}, which is "
            "not there (deleted, or not copied along with the index)",
            "write the index's first line again, as model_checkpoint_path: \"<a checkpoint "
            f'that is there>", to resume from it; or {naming.run_fix}',
        )
    if suffix and not _whole_table(found):
        raise UsageError(
            naming.run,
            f"names {model_dir}, whose latest checkpoint {latest.name} has an index cut short "
            f"({found}: a disk that filled, or a copy that stopped?)",
            "write the checkpoint index's first line again, as model_checkpoint_path: \"<the "
            f'checkpoint before it>", to resume from that one; or {naming.run_fix}',
        )


def _whole_table(index: Path) -> bool:
    """Whether a TensorFlow checkpoint's index ends as a whole table does, in its footer's magic
    number (tensorflow/core/lib/io/format.h): TensorFlow's restore of one cut short fails in a
    traceback ("not an sstable (bad magic number)")."""
    with index.open("rb") as table:
        table.seek(0, os.SEEK_END)
        if table.tell() < len(TABLE_MAGIC):
            return False
        table.seek(-len(TABLE_MAGIC), os.SEEK_END)
        return table.read() == TABLE_MAGIC


def check_same_experiment(
    model_dir: Path, experiment: str, naming: Naming, *, scripts_share: bool = False
) -> None:
    """Refuses a directory whose run trains another experiment; with `scripts_share`
    (with-tfconfig), not another script's: a user's scripts may share one."""
    state = reports.read_state(model_dir)
    then = state.get("experiment")
    if scripts_share and "command" in state:
        return
    # with-tfconfig names a script by its file, the Python API by its stem.
    if isinstance(then, str) and then.removesuffix(".py") != experiment.removesuffix(".py"):
        raise UsageError(
            naming.run,
            f"names {model_dir}, a run of {then!r}, not of {experiment!r}: it would resume "
            "another model's checkpoints and write over that run's record",
            naming.run_fix,
        )


def _by(job: object) -> str:
    return f"by job {job}" if job else "outside SLURM"


def _last_to_train(attempts: object, step: int) -> dict[str, object] | None:
    """The last of state.json's `attempts` to train a step, if any: one that started below the
    next one (or `step`)."""
    if not isinstance(attempts, list):
        return None
    listed = [each for each in attempts if isinstance(each, dict)]
    # None: a new run's, at step 0; not there: an older record's, which did not say.
    starts = [each.get("from_step") or 0 if "from_step" in each else None for each in listed]
    starts.append(step)
    for index in reversed(range(len(listed))):
        start, after = starts[index], starts[index + 1]
        # One that did not say its step (an older record's) trained, for all anyone knows.
        if not isinstance(start, int) or not isinstance(after, int) or start < after:
            return listed[index]
    return None


def before_start(model_dir: Path, train_steps: int) -> str:
    """One line: what an attempt to `train_steps` does with what `model_dir` holds."""
    step = checkpoint_step(model_dir)
    if step is None:
        return f"{model_dir}: a new run, to step {train_steps}"
    state = reports.read_state(model_dir)
    when = state.get("updated")
    at = f" at {time.strftime('%Y-%m-%d %H:%M', time.localtime(when))}" if when else ""
    job, trained = state.get("job_id"), _last_to_train(state.get("attempts"), step)
    if trained is None or trained.get("job_id") == job:
        last = f"last trained {_by(job)}{at}"
    else:
        # An attempt that only evaluated came after: a job that trained nothing is not named.
        last = f"last trained {_by(trained.get('job_id'))}, then evaluated {_by(job)}{at}"
    last += f", {state['state']}" if state.get("state") else ""
    if step < train_steps:
        return f"{model_dir}: resumes the run at step {step}, to step {train_steps} ({last})"
    return (
        f"{model_dir}: the run is at step {step} already, and training ends at step "
        f"{train_steps}: nothing to train, it is only evaluated ({last}). HINT: raise the steps "
        "to train on, or give another experiment id (EXPERIMENT_ID, --experiment_id) to start "
        "a new run"
    )

"""A run's directory and the names of everything the runtime keeps there, in one place, and
where run directories go (the output root). No TensorFlow, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfconfig_slurm.cluster.role import TaskId

# The output root: --output_root, else this variable, else DEFAULT_OUTPUT_ROOT.
OUTPUT_ROOT_VARIABLE = "TFCONFIG_SLURM_OUTPUT"
DEFAULT_OUTPUT_ROOT = "tf-output"
# Under the output root, beside the runs: the lines of each sweep submitted there.
SWEEPS = "sweeps"


def output_root(environ: Mapping[str, str]) -> str:
    """The output root a run takes when no flag names one: the variable, unless it is empty
    (as launch/train.sbatch reads it), else the default."""
    return environ.get(OUTPUT_ROOT_VARIABLE) or DEFAULT_OUTPUT_ROOT


class _Entry:
    """A file or folder of every run directory, by its name there: `run.state` is a Path."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, run: RunDir, owner: Any = None) -> Path:
        return run.path / self.name


@dataclass(frozen=True)
class RunDir:
    """A model directory, as the runtime lays it out beside TensorFlow's checkpoints."""

    path: Path

    lock = _Entry("run.lock")  # held by the run that trains here (claim.py)
    state = _Entry("state.json")  # what the run is doing, for `tfconfig-slurm runs`
    unreadable_state = _Entry("state.json.unreadable")  # one set aside (attempts.py)
    summary = _Entry("summary.json")  # the chief's account of a finished run
    trainer_reports = _Entry("trainers")  # one report a trainer: its steps and speed
    evaluator_result = _Entry("evaluator.json")  # the evaluator's final metrics
    failures = _Entry("failures")  # the first failure of each attempt (failure.py)
    hangs = _Entry("hangs")  # hung tasks' accounts, an attempt a folder (hang_watch.py)
    continuation = _Entry("continued.json")  # the job the run went on in (continuation.py)
    progress = _Entry("progress.json")  # the owner's last logged step (throughput.py)
    refusal = _Entry("refused.json")  # the latest job refused at its start (attempts.py)
    checkpoint_index = _Entry("checkpoint")  # TensorFlow's own, naming the latest checkpoint
    logs = _Entry("logs")  # one log per task, from the batch script or the local cluster

    def trainer_report(self, task: TaskId) -> Path:
        return self.trainer_reports / f"{task.role}-{task.index}.json"

    def native_end(self, task: TaskId) -> Path:
        """Where with-tfconfig puts a task command's fatal end in a native library (JAX's abort)."""
        return self.logs / f"{task.role}-{task.index}-native.log"

    def hang_account(self, run_id: str, task: TaskId) -> Path:
        """A hung task's account of where it waits in the attempt `run_id`, for its peers."""
        return self.hangs / run_id / f"{task.role}-{task.index}.json"

    def failure(self, run_id: str) -> Path:
        """The first failure of the attempt `run_id`."""
        return self.failures / f"{run_id}.json"

    def continuation_claim(self, job: str) -> Path:
        """Made by the one task that submits job `job`'s continuation, where two may try."""
        return self.path / f".continuation-of-{job}"

    def export(self, name: str) -> Path:
        """Where the model is exported, one timestamped folder per export."""
        return self.path / "export" / name

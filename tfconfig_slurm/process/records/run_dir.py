"""A run's directory and the names of everything the runtime keeps there, in one place: the
lock, state.json, summary.json, the trainers' reports, the evaluator's result, the task logs
and the export; and where run directories go (the output root). No TensorFlow, no I/O."""

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

    # Held by the run that trains here (process/records/claim.py).
    lock = _Entry("run.lock")
    # What the run is doing, for `tfconfig-slurm runs`.
    state = _Entry("state.json")
    # The chief's account of a finished run: metrics and every trainer's speed.
    summary = _Entry("summary.json")
    # One report a trainer: its steps and speed.
    trainer_reports = _Entry("trainers")
    # The evaluator's metrics of the final checkpoint, for the chief's summary.
    evaluator_result = _Entry("evaluator.json")
    # The first failure of each attempt (process/records/failure.py).
    failures = _Entry("failures")
    # Each hung task's account of itself, an attempt a folder (process/task/hang_watch.py).
    hangs = _Entry("hangs")
    # The job the run went on in, where its own could not requeue (process/job/continuation.py).
    continuation = _Entry("continued.json")
    # The global step the run's owner last logged, while it trains (process/task/throughput.py).
    progress = _Entry("progress.json")
    # The latest job refused at its start (process/records/refusal.py).
    refusal = _Entry("refused.json")
    # TensorFlow's own file naming the latest checkpoint.
    checkpoint_index = _Entry("checkpoint")
    # One log per task, from the batch script or the local cluster.
    logs = _Entry("logs")

    def trainer_report(self, task: TaskId) -> Path:
        return self.trainer_reports / f"{task.role}-{task.index}.json"

    def native_end(self, task: TaskId) -> Path:
        """Where with-tfconfig puts a task command's fatal end in a native library (JAX's abort
        when a peer died): the lines from its FATAL line on, said in one line in its output."""
        return self.logs / f"{task.role}-{task.index}-native.log"

    def hang_account(self, run_id: str, task: TaskId) -> Path:
        """A hung task's account of where it waits, in the attempt `run_id`, which its hung
        peers read to name the one to blame (process/task/hang_watch.py)."""
        return self.hangs / run_id / f"{task.role}-{task.index}.json"

    def failure(self, run_id: str) -> Path:
        """The first failure of the attempt `run_id`."""
        return self.failures / f"{run_id}.json"

    def continuation_claim(self, job: str) -> Path:
        """Made by the one task that submits job `job`'s continuation: two may try at once
        (the chief's requeue, the batch script after a node's failure)."""
        return self.path / f".continuation-of-{job}"

    def export(self, name: str) -> Path:
        """Where the model is exported, one timestamped folder per export."""
        return self.path / "export" / name

"""A run's directory and the names of everything the runtime keeps there, in one place: the
lock, state.json, summary.json, the trainers' reports, the evaluator's result, the task logs
and the export; and where run directories go (the output root). No TensorFlow, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tfconfig_slurm.cluster.role import TaskId

# The output root: --output_root, else this variable, else DEFAULT_OUTPUT_ROOT.
OUTPUT_ROOT_VARIABLE = "TFCONFIG_SLURM_OUTPUT"
DEFAULT_OUTPUT_ROOT = "tf-output"
# Under the output root, beside the runs: the lines of each sweep submitted there.
SWEEPS = "sweeps"


def output_root(environ: Mapping[str, str]) -> str:
    """The output root a run takes when no flag names one."""
    return environ.get(OUTPUT_ROOT_VARIABLE, DEFAULT_OUTPUT_ROOT)


@dataclass(frozen=True)
class RunDir:
    """A model directory, as the runtime lays it out beside TensorFlow's checkpoints."""

    path: Path

    @property
    def lock(self) -> Path:
        """Held by the run that trains here (process/claim.py)."""
        return self.path / "run.lock"

    @property
    def state(self) -> Path:
        """What the run is doing, for `tfconfig-slurm runs`."""
        return self.path / "state.json"

    @property
    def summary(self) -> Path:
        """The chief's account of a finished run: metrics and every trainer's speed."""
        return self.path / "summary.json"

    @property
    def trainer_reports(self) -> Path:
        return self.path / "trainers"

    def trainer_report(self, task: TaskId) -> Path:
        return self.trainer_reports / f"{task.role}-{task.index}.json"

    @property
    def evaluator_result(self) -> Path:
        """The evaluator's metrics of the final checkpoint, for the chief's summary."""
        return self.path / "evaluator.json"

    @property
    def failures(self) -> Path:
        return self.path / "failures"

    def failure(self, run_id: str) -> Path:
        """The first failure of the attempt `run_id` (process/failure.py)."""
        return self.failures / f"{run_id}.json"

    @property
    def checkpoint_index(self) -> Path:
        """TensorFlow's own file naming the latest checkpoint."""
        return self.path / "checkpoint"

    @property
    def logs(self) -> Path:
        """One log per task, from the batch script or the local cluster."""
        return self.path / "logs"

    def export(self, name: str) -> Path:
        """Where the model is exported, one timestamped folder per export."""
        return self.path / "export" / name

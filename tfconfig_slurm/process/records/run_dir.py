"""A run's directory and the names of everything the runtime keeps there, in one place, and
where run directories go (the output root). No TensorFlow, no I/O."""

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

# RunDir's attributes: each a file or folder of every run directory, by its name there.
_ENTRIES = {
    "lock": "run.lock",  # held by the run that trains here (claim.py)
    "state": "state.json",  # what the run is doing, for `tfconfig-slurm runs`
    "summary": "summary.json",  # the chief's account of a finished run
    "trainer_reports": "trainers",  # one report a trainer: its steps and speed
    "evaluator_result": "evaluator.json",  # the evaluator's final metrics
    "failures": "failures",  # the first failure of each attempt (failure.py)
    "hangs": "hangs",  # hung tasks' accounts, an attempt a folder (process/task/hang_watch.py)
    "continuation": "continued.json",  # the job the run went on in (process/job/continuation.py)
    "progress": "progress.json",  # the owner's last logged step (process/task/throughput.py)
    "refusal": "refused.json",  # the latest job refused at its start (refusal.py)
    "checkpoint_index": "checkpoint",  # TensorFlow's own, naming the latest checkpoint
    "logs": "logs",  # one log per task, from the batch script or the local cluster
}


def output_root(environ: Mapping[str, str]) -> str:
    """The output root a run takes when no flag names one: the variable, unless it is empty
    (as launch/train.sbatch reads it), else the default."""
    return environ.get(OUTPUT_ROOT_VARIABLE) or DEFAULT_OUTPUT_ROOT


@dataclass(frozen=True)
class RunDir:
    """A model directory beside TensorFlow's checkpoints: `run.state`, as _ENTRIES, is a Path."""

    path: Path

    def __getattr__(self, attribute: str) -> Path:
        if attribute not in _ENTRIES:
            raise AttributeError(attribute)
        return self.path / _ENTRIES[attribute]

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

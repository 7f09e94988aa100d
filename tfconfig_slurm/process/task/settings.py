"""How to train, as `python -m tfconfig_slurm.run`'s flags say it: the same settings for an
Estimator experiment (backends/estimator/experiment_training.py) and a Keras one
(backends/keras/train.py). No TensorFlow."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainingSettings:
    """How to train: the flags of `python -m tfconfig_slurm.run` that are not the layout's."""

    model_dir: Path
    train_steps: int
    eval_steps: int | None
    params: Mapping[str, Any]
    save_checkpoints_steps: int | None
    save_checkpoints_secs: int | None
    keep_checkpoint_max: int
    intra_op_threads: int
    inter_op_threads: int
    gpu_memory_growth: bool
    gpu_memory_fraction: float | None
    log_every_steps: int
    sync_replicas: bool
    # Steps a call of the Keras 3 step function runs, where the experiment's compile left
    # Keras's 1; None: as it compiled.
    steps_per_execution: int | None = None

    def hparams(self, names: Iterable[str]) -> dict[str, Any]:
        """This run's values of the hparams `names` (an experiment's HPARAMS)."""
        return {name: self.params[name] for name in names}

"""How to train, as `python -m tfconfig_slurm.run`'s flags say it, for an Estimator experiment
and a Keras one alike. No TensorFlow."""

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
    # Keras 3's steps a call, where the experiment's compile left the default 1; None: as compiled.
    steps_per_execution: int | None = None

    def hparams(self, names: Iterable[str]) -> dict[str, Any]:
        """This run's values of the hparams `names` (an experiment's HPARAMS)."""
        return {name: self.params[name] for name in names}

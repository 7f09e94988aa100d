"""What the Keras backends (train.py, coordinator.py, sidecar.py) share as the lifecycle's backend
(process/lifecycle.py): the run's experiment, settings and hparams; and, once training is set
up in this process, the hparams' record for TensorBoard."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, Protocol

from tfconfig_slurm.backends.keras.model_dir import write_hparams
from tfconfig_slurm.process import preemption
from tfconfig_slurm.process.experiment import KerasExperiment
from tfconfig_slurm.process.lifecycle import Hparam
from tfconfig_slurm.process.settings import TrainingSettings


class SetUp(Protocol):
    """Training (or evaluation) set up in this process: its summary writer."""

    @property
    def writer(self) -> Any: ...


class KerasBackendBase(abc.ABC):
    """A Keras backend: what it trains, and what it answers once `_set_up()` has built it."""

    def __init__(
        self,
        experiment: KerasExperiment,
        settings: TrainingSettings,
        stop: preemption.StopRequest,
    ) -> None:
        self._experiment = experiment
        self._settings = settings
        self._stop = stop
        self.experiment = experiment.name
        self.train_steps = settings.train_steps
        self.hparams: Mapping[str, Any] = settings.hparams(experiment.hparams)

    @abc.abstractmethod
    def _set_up(self) -> SetUp:
        """Training set up in this process, on the first call."""

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        write_hparams(self._set_up().writer, hparams, trial_id)

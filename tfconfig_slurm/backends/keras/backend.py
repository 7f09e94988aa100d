"""What the tf-keras backends share beyond keras_run.KerasRun: the hparams' record for
TensorBoard, and for the two that train, the checkpoint step their saver last wrote."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, Protocol

from tfconfig_slurm.backends.keras.model_dir import Saver, write_hparams
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.task.keras_run import KerasRun
from tfconfig_slurm.process.task.lifecycle import Hparam


class SetUp(Protocol):
    """Training (or evaluation) set up in this process: its summary writer."""

    @property
    def writer(self) -> Any: ...


class KerasBackendBase(KerasRun, abc.ABC):
    """A tf-keras backend: what it trains, and what it answers once `_set_up()` has built it."""

    @property
    def _cluster_role(self) -> ClusterRole:
        """This task's role, for the backends that run only in a cluster (a coordinator's)."""
        assert self._role is not None, "the edge gives a coordinator's tasks a cluster role"
        return self._role

    @abc.abstractmethod
    def _set_up(self) -> SetUp:
        """Training set up in this process, on the first call."""

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        write_hparams(self._set_up().writer, hparams, trial_id)


class TrainingSetUp(SetUp, Protocol):
    """Training set up in this process: its summary writer and its checkpoints' saver."""

    @property
    def saver(self) -> Saver: ...


class TrainingBackendBase(KerasBackendBase):
    """A Keras backend that trains (train.py, coordinator.py) and so writes the checkpoints."""

    @abc.abstractmethod
    def _set_up(self) -> TrainingSetUp:
        """Training set up in this process, on the first call."""

    def checkpoint_step(self) -> int:
        return self._set_up().saver.last

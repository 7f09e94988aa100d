"""What the tf-keras backends share beyond keras_run.KerasRun: the experiment's batches,
checked; the hparams' record for TensorBoard, and for the two that train, the checkpoint step
their saver last wrote."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfconfig_slurm.backends.keras.model_dir import write_hparams
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.task.keras_run import KerasRun
from tfconfig_slurm.process.task.lifecycle import Hparam
from tfconfig_slurm.process.user_code.experiment import KerasExperiment


class KerasBackendBase(KerasRun, abc.ABC):
    """A tf-keras backend: what it trains, and what it answers once `_set_up()` has built it."""

    @property
    def _cluster_role(self) -> ClusterRole:
        """This task's role, for the backends that run only in a cluster (a coordinator's)."""
        assert self._role is not None, "the edge gives a coordinator's tasks a cluster role"
        return self._role

    @abc.abstractmethod
    def _set_up(self) -> Any:
        """Training (or evaluation) set up in this process, on the first call: its summary
        `writer`, and where it trains, its checkpoints' `saver` (model_dir.Saver)."""

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        write_hparams(self._set_up().writer, hparams, trial_id)


class TrainingBackendBase(KerasBackendBase):
    """A Keras backend that trains (train.py, coordinator.py) and so writes the checkpoints."""

    def checkpoint_step(self) -> int:
        last: int = self._set_up().saver.last
        return last


def experiment_dataset(
    experiment: KerasExperiment, mode: str, params: Mapping[str, Any]
) -> tf.data.Dataset:
    """The experiment's dataset(mode, params), refused in one line unless a tf.data.Dataset."""
    batches = experiment.dataset(mode, params)
    if not isinstance(batches, tf.data.Dataset):
        raise UsageError(
            "--experiment",
            f"{experiment.name}.dataset({mode!r}, params) returned a {type(batches).__name__}, "
            "not a tf.data.Dataset",
            "return batches of params['batch_size'], e.g. tf.data.Dataset.from_tensor_slices("
            "(x, y)).batch(params['batch_size'])",
        )
    return batches


def eval_batches(experiment: KerasExperiment, params: Mapping[str, Any]) -> tf.data.Dataset:
    """The whole eval set: in a cluster each trainer evaluates a share of each batch, and the
    metrics come out of evaluate() summed over all (the same on every trainer)."""
    batches = experiment_dataset(experiment, "eval", params)
    options = tf.data.Options()
    # Its examples come from Python or memory, not files: shard batches by their elements.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return batches.with_options(options)

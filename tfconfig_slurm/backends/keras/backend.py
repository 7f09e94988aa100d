"""What the tf-keras backends (train.py, coordinator.py) share beyond keras_run.KerasRun: their
base, the experiment's model and batches, checked, and what they keep in the model directory:
checkpoints numbered by the global step, the model restored from the latest, the hparams and
the final evaluation for TensorBoard, and the exported SavedModel."""

from __future__ import annotations

import abc
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras
from absl import logging
from tensorboard.plugins.hparams import api as hparams_api

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.task.keras_run import KerasRun
from tfconfig_slurm.process.task.lifecycle import Hparam, TrainingSettings
from tfconfig_slurm.process.user_code.experiment import (
    KerasExperiment,
    check_compiled,
    keeping_learning_rate,
    returned,
    type_named,
)

_CHECKPOINT_NAME = "ckpt"
# TensorFlow 2.16+ logs the time of each checkpoint's sharding at INFO through absl, among
# the runtime's own lines.
logging.get_absl_logger().addFilter(
    lambda record: not record.pathname.endswith("functional_saver.py")
)


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
        `writer`, and where it trains, its checkpoints' `saver` (Saver)."""

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        """The run's hparams beside its scalars, whose eval/ ones are the metrics TensorBoard's
        HParams tab shows."""
        with self._set_up().writer.as_default():
            hparams_api.hparams(dict(hparams), trial_id=trial_id)


class TrainingBackendBase(KerasBackendBase):
    """A Keras backend that trains (train.py, coordinator.py) and so writes the checkpoints."""

    def checkpoint_step(self) -> int:
        last: int = self._set_up().saver.last
        return last

    def _restored(self, strategy: tf.distribute.Strategy) -> tuple[Any, Saver]:
        """The experiment's model under the strategy, restored from the model directory's
        latest checkpoint, and the saver of its checkpoints (`last`: the step restored)."""
        with strategy.scope():
            model = built_model(self._experiment, self._settings.params)
        return model, Saver(model, self._settings, self._role, self._stop)


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


def built_model(experiment: KerasExperiment, params: Mapping[str, Any]) -> Any:
    """The experiment's build_model(params), refused unless a compiled tf-keras model: a Keras
    3 model failed only at the export, an uncompiled one deep in TensorFlow's checkpoints."""
    model = experiment.build_model(params)
    if not isinstance(model, keras.Model):
        keras_3 = type(model).__module__.startswith("keras.")
        what = (
            f"a Keras 3 model ({type_named(model)})"
            if keras_3
            else f"{returned(model)}, not a Keras model"
        )
        raise UsageError(
            "--experiment",
            f"{experiment.name}'s build_model returned {what}",
            "build a tf-keras model: import tf_keras as keras (tf.distribute does not train "
            "Keras 3); or import keras alone, and the experiment trains on JAX (docs/keras3.md)"
            if keras_3
            else "return the compiled tf_keras.Model",
        )
    check_compiled(experiment, model)
    return model


class Saver:
    """The model restored from the latest checkpoint, and checkpoints numbered by the global
    step: the chief's (or a single process's) into the model directory, timed for the stop
    before the time limit (process/job/preemption.py); another trainer's into a scratch
    directory it deletes, since every trainer must take part in a save."""

    def __init__(
        self,
        model: Any,
        settings: TrainingSettings,
        role: ClusterRole | None,
        stop: preemption.StopRequest,
    ) -> None:
        directory = settings.model_dir
        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        latest = tf.train.latest_checkpoint(str(directory))
        if latest is not None:
            keeping_learning_rate(
                model.optimizer, lambda: checkpoint.restore(latest).expect_partial()
            )
        # On the node's own disk, named, not made: the manager makes it at a save, which then
        # deletes it, so that a worker that never saves leaves nothing behind.
        self._scratch = (
            None
            if role is None or role.role == CHIEF
            else Path(tempfile.gettempdir())
            / f"tfconfig-slurm-{role.role}-{role.index}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self._manager = tf.train.CheckpointManager(
            checkpoint,
            str(self._scratch or directory),
            max_to_keep=settings.keep_checkpoint_max,
            checkpoint_name=_CHECKPOINT_NAME,
        )
        # The step of the latest checkpoint (first the one restored, not to be written again).
        self.last = int(model.optimizer.iterations.numpy())
        self._stop = stop

    def save(self, step: int) -> None:
        if step == self.last:
            return
        started = time.monotonic()
        self._manager.save(checkpoint_number=step)
        self.last = step
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        else:
            self._stop.checkpoint_written(step, time.monotonic() - started)


def evaluate_checkpoint(
    model: Any, path: str, batches: tf.data.Dataset, steps: int | None
) -> dict[str, float]:
    """The metrics of the model's weights in checkpoint `path` on `batches` (all of them, or
    `steps`), for a process outside the training cluster: the sidecar, the final evaluation."""
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    metrics = model.evaluate(batches, steps=steps, return_dict=True, verbose=0)
    return {name: float(value) for name, value in metrics.items()}


def write_eval_scalars(directory: Path, metrics: Mapping[str, Any], step: int) -> None:
    """The final evaluation, where TensorBoard shows the Estimator's: the eval/ run."""
    writer = tf.summary.create_file_writer(str(directory / "eval"))
    write_scalars(writer, metrics, step)
    writer.close()


def write_scalars(writer: Any, metrics: Mapping[str, Any], step: int) -> None:
    """Scalars at `step` (of an evaluation's metrics, all but the step itself), flushed."""
    with writer.as_default(step=step):
        for name, value in metrics.items():
            if name != "global_step":
                tf.summary.scalar(name, float(value))
    writer.flush()


def export(model: Any, directory: Path, name: str, role: ClusterRole | None) -> None:
    """The trained model as a SavedModel, in export/<name>/<timestamp> as an Estimator
    exports it. Every trainer saves, as the strategy's collectives require; another trainer
    than the chief into a scratch directory it deletes."""
    if role is None or role.role == CHIEF:
        path = RunDir(directory).export(name) / str(int(time.time()))
        model.save(str(path))
        logging.info("exported the model to %s", path)
        return
    scratch = tempfile.mkdtemp(prefix=f"tfconfig-slurm-{role.role}-{role.index}-export-")
    try:
        model.save(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

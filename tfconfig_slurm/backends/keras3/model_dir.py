"""What the Keras 3 backend keeps in the model directory: checkpoints numbered by the global
step (`ckpt-<step>.weights.h5`, the weights and the optimizer's state), the model restored
from the latest, the scalars and hparams for TensorBoard (its own event writer: no
TensorFlow), and the exported `.keras` model.

Every process takes part in a save, as JAX's arrays span them all: the chief (or a single
process) writes into the model directory, the others into scratch files they delete. A
variable sharded across processes (ModelParallel) is gathered whole for it (whole()).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import keras
from absl import logging
from jax.experimental import multihost_utils
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import files, history
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.task.lifecycle import Hparam
from tfconfig_slurm.process.user_code.experiment import (
    KerasExperiment,
    check_compiled,
    keeping_learning_rate,
    returned,
)

_CHECKPOINT = re.compile(r"ckpt-(\d+)\.weights\.h5")


def built_model(experiment: KerasExperiment, params: Mapping[str, Any]) -> Any:
    """The experiment's build_model(params), refused in one line unless a compiled Keras 3
    model."""
    model = experiment.build_model(params)
    if not isinstance(model, keras.Model):
        raise UsageError(
            "--experiment",
            f"{experiment.name}'s build_model returned {returned(model)}, not a Keras 3 model",
            "build it with import keras (Keras 3); a tf_keras model trains with the tf2 "
            "install (.venv-tf2)",
        )
    check_compiled(experiment, model)
    return model


class Checkpoints:
    """The model's checkpoints: restores the latest, saves by step, keeps the last `keep`."""

    def __init__(
        self,
        model: Any,
        directory: Path,
        role: ClusterRole | None,
        keep: int,
        *,
        stop: preemption.StopRequest,
    ) -> None:
        self._model = model
        self._directory = directory
        self._writes = role is None or role.role == CHIEF
        self._keep = keep
        self._stop = stop
        step = history.checkpoint_step(directory)
        if step is not None:
            _restore(model, directory, step)
        # The step of the latest checkpoint (first the one restored, not to be written again).
        self.last = int(model.optimizer.iterations.numpy())

    def save(self, step: int) -> None:
        if step == self.last:
            return
        started = time.monotonic()
        # Mid-fit, the JAX trainer keeps the variables' values off the model until asked;
        # they are those of the last step dispatched, which the write waits for: timed apart.
        self._model.jax_state_sync()
        jax.block_until_ready([variable.value for variable in self._model.variables])
        waited = time.monotonic() - started
        with whole(self._model):
            if self._writes:
                # Written whole, then named: a process killed mid-write leaves no checkpoint
                # that a resume would take for the latest.
                path = self._directory / _name(step)
                partial = path.with_name(f".{path.name}.partial.weights.h5")
                self._model.save_weights(partial)
                files.replace_durably(partial, path)
                self._index(step)
                self._stop.checkpoint_written(step, time.monotonic() - started, waited)
            else:
                _into_scratch(self._model.save_weights, ".weights.h5")
        self.last = step

    def _index(self, step: int) -> None:
        """Names the latest checkpoint as TensorFlow's index does (the one file the runs table
        and a resume read), then forgets all but the last `keep` up to it, and any past it (a
        chief killed after writing one, before naming it, left it; the run went on from the
        one named)."""
        steps = _steps(self._directory)
        upto = [each for each in steps if each <= step]
        kept = upto[-self._keep :]
        forgotten = [each for each in steps if each not in kept]
        files.write_atomically(
            RunDir(self._directory).checkpoint_index,
            f'model_checkpoint_path: "{_name(step)}"\n'
            + "".join(f'all_model_checkpoint_paths: "{_name(each)}"\n' for each in kept),
        )
        for each in forgotten:
            (self._directory / _name(each)).unlink(missing_ok=True)


@contextlib.contextmanager
def whole(model: Any) -> Iterator[None]:
    """Every variable of the model and of its optimizer whole in every process while Keras
    reads them (to save, or get_weights): Keras reads each as a numpy array, which JAX refuses
    for an array that spans processes. Each sharded one's value is gathered (a collective:
    every process enters this) and stands in for it meanwhile, as Keras's Variable keeps its
    array in _value, which nothing public replaces without laying it out again."""
    gathered: list[tuple[Any, Any]] = []
    try:
        for variable in [*model.variables, *model.optimizer.variables]:
            value = variable.value
            if isinstance(value, jax.Array) and not value.is_fully_replicated:
                whole_value = multihost_utils.process_allgather(value, tiled=True)
                gathered.append((variable, variable._value))
                variable._value = whole_value
        yield
    finally:
        for variable, value in reversed(gathered):
            variable._value = value


def _restore(model: Any, directory: Path, step: int) -> None:
    """The model's weights and optimizer's state from the checkpoint of `step`, else from the
    newest before it that reads (a node that crashed as it wrote one can leave it truncated:
    the one skipped is named), or one line that says why none can be: a checkpoint that is
    gone, of another model (one of another backend is refused before:
    history.check_resumable), or none that reads."""
    path = directory / _name(step)
    if not path.is_file():
        raise UsageError(
            "--experiment_id",
            f"names {directory}, whose latest checkpoint ({path.name}) is missing",
            "bring it back to resume; or train this experiment under another --experiment_id "
            "(or --output_root)",
        )
    # The optimizer's variables exist only once built: restored with the weights.
    model.optimizer.build(model.trainable_variables)
    older = sorted((each for each in _steps(directory) if each < step), reverse=True)
    for candidate in [step, *older]:
        try:
            keeping_learning_rate(
                model.optimizer, functools.partial(model.load_weights, directory / _name(candidate))
            )
            return
        except OSError as error:
            logging.warning(
                "skipped %s, which does not read (%s)", _name(candidate), _first_line(error)
            )
        except ValueError as error:
            raise UsageError(
                "--experiment_id",
                f"names {directory}, whose checkpoint of step {candidate} does not fit this "
                f"model ({_first_line(error)})",
                "train a changed model under another --experiment_id (or --output_root)",
            ) from None
    raise UsageError(
        "--experiment_id",
        f"names {directory}, none of whose checkpoints reads (the latest, {path.name}, and "
        f"{len(older)} before it)",
        "train this experiment under another --experiment_id (or --output_root)",
    )


def _steps(directory: Path) -> list[int]:
    """The steps of the checkpoints in `directory`."""
    return sorted(
        int(found[1]) for found in map(_CHECKPOINT.fullmatch, os.listdir(directory)) if found
    )


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _name(step: int) -> str:
    return f"ckpt-{step}.weights.h5"


def _into_scratch(save: Any, suffix: str) -> None:
    """`save(path)` into a scratch file, deleted once written."""
    descriptor, path = tempfile.mkstemp(prefix="tfconfig-slurm-", suffix=suffix)
    os.close(descriptor)
    try:
        save(path)
    finally:
        os.unlink(path)


def export(model: Any, directory: Path, name: str, role: ClusterRole | None) -> None:
    """The trained model as one `.keras` file, in export/<name>/<timestamp>/model.keras (as an
    Estimator exports into timestamped folders)."""
    with whole(model):
        if role is not None and role.role != CHIEF:
            _into_scratch(model.save, ".keras")
            return
        folder = RunDir(directory).export(name) / str(int(time.time()))
        folder.mkdir(parents=True, exist_ok=True)
        model.save(folder / "model.keras")
    logging.info("exported the model to %s", folder / "model.keras")


class Events:
    """A TensorBoard run's event file (the model directory's, or its eval/)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(directory))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                for tag, value in values.items()
            ]
        )
        self._add(summary, step)

    def hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        self._add(hparams_summary.hparams_pb(dict(hparams), trial_id=trial_id), 0)

    def _add(self, summary: Any, step: int) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def write_eval_scalars(directory: Path, metrics: Mapping[str, Any], step: int) -> None:
    """The final evaluation, where TensorBoard shows the Estimator's: the eval/ run."""
    events = Events(directory / "eval")
    events.scalars({k: v for k, v in metrics.items() if k != "global_step"}, step)
    events.close()

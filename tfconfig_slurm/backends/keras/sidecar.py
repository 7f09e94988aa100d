"""The evaluator of a ParameterServerStrategy run (--coordinator --evaluator): a sidecar, as
tf-keras's SidecarEvaluator is, outside the coordinator's cluster (its TF_CONFIG names only
itself: an evaluator in the coordinator's cluster hangs it, TensorFlow #46169). It evaluates
each new checkpoint for TensorBoard's eval/ run, and leaves the metrics of the first at or
past --train_steps for the coordinator's summary.json.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, NamedTuple

import tensorflow as tf
from absl import logging

from tfconfig_slurm.backends.keras.backend import KerasBackendBase
from tfconfig_slurm.backends.keras.data import eval_batches
from tfconfig_slurm.backends.keras.model_dir import (
    built_model,
    eval_writer,
    evaluate_checkpoint,
    write_scalars,
)
from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task.lifecycle import Ending


class SidecarBackend(KerasBackendBase):
    """The evaluator task: each new checkpoint evaluated, until the final step's."""

    _sidecar: _Sidecar | None = None

    def checkpoint_step(self) -> int | None:
        return _step_of(tf.train.latest_checkpoint(str(self._settings.model_dir)))

    def start_details(self) -> tuple[str, ...]:
        return ("evaluating each new checkpoint, outside the coordinator's cluster",)

    def _set_up(self) -> _Sidecar:
        if self._sidecar is None:
            model = built_model(self._experiment, self._settings.params)
            self._sidecar = _Sidecar(model, eval_writer(self._settings.model_dir))
        return self._sidecar

    def train(self, end: Callable[[Ending], Any]) -> Any:
        sidecar, settings, stop = self._set_up(), self._settings, self._stop
        # Until the coordinator has gone, whatever signal this task got: a stopping coordinator
        # may still finish its last steps and wait for their result.
        gone = threading.Event()

        def lost(name: str, address: str, silent_for: float) -> None:
            if not stop.requested:
                watchdog.exit_on_lost(name, address, silent_for)
            gone.set()

        watchdog.PeerWatch(
            self._cluster_role.named(CHIEF), on_lost=lost, on_finished=lambda name: gone.set()
        )
        batches = eval_batches(self._experiment, settings.params)
        run = reports.marker(self._cluster_role, settings.train_steps)
        for path in tf.train.checkpoints_iterator(
            str(settings.model_dir), timeout=timing.CHECKPOINT_LOOK_SECONDS, timeout_fn=gone.is_set
        ):
            step = _step_of(path)
            if step is None:
                continue
            try:
                evaluated = evaluate_checkpoint(sidecar.model, path, batches, settings.eval_steps)
            except tf.errors.OpError as error:
                if step >= settings.train_steps:
                    # No later checkpoint will come: the coordinator evaluates this one itself.
                    logging.warning("evaluator 0: cannot evaluate %s: %s", path, error.message)
                    why = f"{path}: {error.message}"
                    reports.write_evaluator_gave_up(settings.model_dir, run, why)
                    return end(Ending(None))
                # The coordinator deletes old checkpoints (--keep_checkpoint_max) as it saves,
                # maybe the one being read: the next one will come.
                logging.warning("evaluator 0: skipped %s: %s", path, error.message)
                continue
            metrics = {**evaluated, "global_step": step}
            logging.info("evaluator 0: step %d: %s", step, reports.metric_text(metrics))
            write_scalars(sidecar.writer, metrics, step)
            if step >= settings.train_steps:
                reports.write_evaluator_result(settings.model_dir, run, metrics)
                return end(Ending(None))
        if not stop.requested:
            logging.warning("evaluator 0: the coordinator ended before its final step")
        return end(Ending(stop.signal_name if stop.requested else None))


class _Sidecar(NamedTuple):
    """The evaluator, set up: the experiment's model and the eval/ writer."""

    model: Any
    writer: Any


def _step_of(path: str | None) -> int | None:
    """The global step a checkpoint's path is numbered by (ckpt-<step>)."""
    number = re.search(r"-(\d+)$", path or "")
    return int(number.group(1)) if number else None

"""The Keras backend's parameter-server flavour (TensorFlow 2.16+, tf-keras): the coordinator
of a tf.distribute.ParameterServerStrategy cluster, whose parameter servers and workers only
serve (serve.py), supervised as process/supervision/supervise.py supervises.

The coordinator restores the model under the strategy (its variables split across the ps by
size) and trains the steps left with model.fit, in epochs of --log_every_steps after each of
which it logs and checkpoints where due (_Epochs); _InFlight ends fit soon after a stop. At
the end it takes the final metrics from the run's evaluator (SidecarBackend), or evaluates in
a process of its own (main), and writes summary.json.

The evaluator (--coordinator --evaluator) is a sidecar, as tf-keras's SidecarEvaluator is,
outside the coordinator's cluster (its TF_CONFIG names only itself: an evaluator in the
coordinator's cluster hangs it, TensorFlow #46169). It evaluates each new checkpoint for
TensorBoard's eval/ run, and leaves the metrics of the first at or past --train_steps for the
coordinator's summary.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Any, Callable, NamedTuple

import tensorflow as tf
import tf_keras as keras
from absl import logging

from tfconfig_slurm.backends.keras.backend import (
    KerasBackendBase,
    Saver,
    TrainingBackendBase,
    built_model,
    eval_batches,
    evaluate_checkpoint,
    experiment_dataset,
    write_eval_scalars,
    write_scalars,
)
from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch, keras_run
from tfconfig_slurm.process.task.lifecycle import Ending, TrainingSettings
from tfconfig_slurm.process.task.throughput import Throughput, epoch_steps
from tfconfig_slurm.process.user_code.experiment import KerasExperiment, load_keras

# A variable smaller than this stays whole on one parameter server.
_MIN_SHARD_BYTES = 256 << 10


class CoordinatorBackend(TrainingBackendBase):
    """ParameterServerStrategy training as the lifecycle's backend, on the coordinator: the
    cluster's model, restored, trained with fit to --train_steps, evaluated and reported."""

    _coordinator: _Coordinator | None = None

    def start_details(self) -> tuple[str, ...]:
        workers, servers = self._cluster_role.workers, self._cluster_role.ps_count
        return (f"coordinating {workers} worker(s) and {servers} parameter server(s)",)

    def _set_up(self) -> _Coordinator:
        if self._coordinator is not None:
            return self._coordinator
        settings, role = self._settings, self._cluster_role
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(
            resolver,
            variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=_MIN_SHARD_BYTES, max_shards=role.ps_count
            ),
        )
        model, saver = self._restored(strategy)
        writer = tf.summary.create_file_writer(str(settings.model_dir))
        self._coordinator = _Coordinator(strategy, model, saver, writer)
        return self._coordinator

    def train(self, end: Callable[[Ending], Any]) -> Any:
        coordinator, settings = self._set_up(), self._settings
        started = time.monotonic()

        def finish() -> Any:
            """Saves, evaluates and reports the run (or its stop), and ends it."""
            hang_watch.paused()
            epochs.meter.end()
            stopped_on = epochs.stopped_on if epochs.step < settings.train_steps else None
            coordinator.saver.save(epochs.step)
            if stopped_on is None:
                self._report(epochs, started)
            return end(Ending(stopped_on))

        left = settings.train_steps - coordinator.saver.last
        every = epoch_steps(left, settings.log_every_steps)
        epochs = _Epochs(coordinator, settings, self._stop, finish, every)
        if left <= 0:
            return finish()
        batches = keras.utils.experimental.DatasetCreator(
            partial(_worker_batches, self._experiment, settings.params, self._cluster_role.workers)
        )
        # Whole epochs of --log_every_steps, then one of what is left; the last fit ends the
        # run from inside (_Epochs.on_train_end).
        hang_watch.began(epochs.step)
        for count, steps in ((left // every, every), (1, left % every)):
            if count and steps and not epochs.stopped_on:
                coordinator.model.fit(
                    batches,
                    epochs=count,
                    steps_per_epoch=steps,
                    callbacks=[_InFlight(self._cluster_role.workers, self._stop, epochs), epochs],
                    verbose=0,
                )
        return epochs.result

    def _report(self, epochs: _Epochs, started: float) -> None:
        """The final checkpoint's metrics, from the run's evaluator (SidecarBackend) or evaluated
        here; summary.json."""
        directory, role = self._settings.model_dir, self._cluster_role
        marker = reports.marker(role, self._settings.train_steps)
        metrics = reports.evaluator_result(directory, marker) if role.has_evaluator else None
        if metrics is None:
            metrics = {**self._evaluate(), "global_step": epochs.step}
            write_eval_scalars(directory, metrics, epochs.step)
        mean = epochs.meter.mean_examples_per_sec()
        reports.write_summary(
            directory,
            name=self._experiment.name,
            metrics=metrics,
            wall_time_s=time.monotonic() - started,
            # The workers' steps, as the coordinator counts them: the cluster's throughput.
            trainers=[{"role": CHIEF, "index": 0, "examples_per_sec": mean}],
            layout=role.jobs(),
        )

    def _evaluate(self) -> dict[str, float]:
        """The final checkpoint evaluated in a process of its own, outside any cluster (main):
        a model of the coordinator's own runs its functions as the cluster's, and its evaluation
        failed or hung here (CancelledError: RemoteExecuteNode::RunAsync)."""
        settings = self._settings
        command = [
            sys.executable, "-m", "tfconfig_slurm.backends.keras.coordinator",
            self._experiment.spec, str(settings.model_dir), json.dumps(dict(settings.params)),
            *([str(settings.eval_steps)] if settings.eval_steps else []),
        ]  # fmt: skip
        outside = {name: value for name, value in os.environ.items() if name != "TF_CONFIG"}
        return run_evaluation(command, outside)


def run_evaluation(
    command: list[str], environ: Mapping[str, str], seconds: float = timing.EVALUATE_SECONDS
) -> dict[str, float]:
    """The metrics an evaluation process prints as its last line of output; EvaluationError,
    with the end of its stderr, where it fails, hangs past `seconds`, or prints none."""
    try:
        evaluated = subprocess.run(
            command,
            env=dict(environ),
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired as late:
        raise EvaluationError(f"took more than {seconds:.0f} s", late.stderr) from None
    if evaluated.returncode != 0:
        raise EvaluationError(f"exited {evaluated.returncode}", evaluated.stderr)
    said = evaluated.stdout.strip().splitlines()
    try:
        metrics: dict[str, float] = json.loads(said[-1])
    except (IndexError, ValueError):
        raise EvaluationError(
            f"printed no metrics as its last line ({said[-1:]})", evaluated.stderr
        ) from None
    return metrics


class EvaluationError(RuntimeError):
    """The final evaluation's process failed, with the end of what it said on stderr."""

    def __init__(self, what: str, stderr: str | bytes | None) -> None:
        text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
        super().__init__(f"the final evaluation {what}: {text[-3000:]}")


def _worker_batches(
    experiment: KerasExperiment, params: Mapping[str, Any], workers: int, _: Any
) -> tf.data.Dataset:
    """A worker's stream of dataset("train", params), trainer_index (a scalar int64 tensor)
    saying which worker reads it. Traced once on the coordinator and run on every worker,
    where InputContext says one pipeline of id 0: only the worker index TensorFlow fills in
    as a worker runs it tells the workers apart."""
    index = tf.distribute.coordinator.experimental_get_current_worker_index()
    share = {**params, "num_trainers": workers, "trainer_index": index}
    return experiment_dataset(experiment, "train", share).repeat()


class _Coordinator(NamedTuple):
    """The coordinator, set up: the strategy, the model on the parameter servers, its saver
    and summary writer."""

    strategy: tf.distribute.Strategy
    model: Any
    saver: Saver
    writer: Any


class _InFlight(keras.callbacks.Callback):  # type: ignore[misc]
    """Holds the coordinator to STEPS_A_WORKER scheduled steps a worker not yet done, and ends
    fit after the step scheduled when a stop was asked for: left to itself, the coordinator
    schedules an epoch's steps at once, and fit ends only when all have run."""

    # Steps a worker may have scheduled and not done: one running, one ready behind it.
    STEPS_A_WORKER = 2

    def __init__(self, workers: int, stop: preemption.StopRequest, epochs: _Epochs) -> None:
        super().__init__()
        # Whose global step, at the last epoch's end, the steps scheduled since add to.
        self._epochs = epochs
        # Its batch hooks take the steps' RemoteValues, which fit then hands it as they are
        # (the strategy refuses a batch hook that would have them made numbers).
        self._supports_tf_logs = True
        self._scheduled: deque[Any] = deque()
        self._most = self.STEPS_A_WORKER * max(1, workers)
        self._stop = stop

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._scheduled.append(logs)
        while len(self._scheduled) > self._most:
            self._scheduled.popleft().fetch()
        hang_watch.stepped(self._epochs.step + batch + 1)
        if self._stop.requested:
            self.model.stop_training = True


class _Epochs(keras.callbacks.Callback):  # type: ignore[misc]
    """After each epoch: the loss and examples/s logged and written, a checkpoint where due,
    and a stop where asked for. The fit that reaches the last step, or stops, ends the run
    from its last callback, as train._FinishInside does: leaving fit deletes the workers'
    iterators, which can hold the coordinator for minutes."""

    def __init__(
        self,
        coordinator: _Coordinator,
        settings: TrainingSettings,
        stop: preemption.StopRequest,
        finish: Callable[[], Any],
        every: int,
    ) -> None:
        super().__init__()
        self.step = coordinator.saver.last
        self.stopped_on: str | None = None
        # A line each epoch of `every` steps.
        self.meter = Throughput(every)
        self.result: Any = None
        self._settings = settings
        self._cadence = keras_run.CheckpointCadence(
            settings.save_checkpoints_steps, settings.save_checkpoints_secs
        )
        self._coordinator = coordinator
        self._stop = stop
        self._finish = finish

    def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        # Every step scheduled has run by now (at least once: a step a lost worker had begun
        # may run again elsewhere): the optimizer's iterations are the global step.
        step = int(self._coordinator.model.optimizer.iterations.numpy())
        steps, self.step = step - self.step, step
        loss = float((logs or {}).get("loss", 0.0))
        rates = self.meter.step(
            step, steps * self._settings.params["batch_size"], loss, steps=steps
        )
        if rates is not None:
            scalars = {"loss": loss, "global_steps_per_sec": rates.global_steps_per_sec}
            if rates.examples_per_sec is not None:
                scalars["examples_per_sec"] = rates.examples_per_sec
            write_scalars(self._coordinator.writer, scalars, step)
        if self._cadence.by_steps(step - steps, step) or self._cadence.by_time():
            self._coordinator.saver.save(step)
            self._cadence.saved()
        if self._stop.requested and self.stopped_on is None:
            self.stopped_on = self._stop.signal_name
            logging.info("stopping on %s at global step %d", self.stopped_on, step)
            self.model.stop_training = True

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.stopped_on or self.step >= self._settings.train_steps:
            self.result = self._finish()


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
            writer = tf.summary.create_file_writer(str(self._settings.model_dir / "eval"))
            self._sidecar = _Sidecar(model, writer)
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


def main() -> None:
    """The final evaluation's own process (CoordinatorBackend._evaluate), which prints the
    metrics of the latest checkpoint as one line of JSON; its arguments: EXPERIMENT MODEL_DIR
    PARAMS_JSON [EVAL_STEPS]."""
    spec, model_dir, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    experiment = load_keras(spec)
    metrics = evaluate_checkpoint(
        built_model(experiment, params),
        tf.train.latest_checkpoint(model_dir),
        eval_batches(experiment, params),
        int(sys.argv[4]) if len(sys.argv) > 4 else None,
    )
    sys.stdout.write(json.dumps(metrics) + "\n")


if __name__ == "__main__":
    main()

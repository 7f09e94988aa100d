"""The Keras backend (TensorFlow 2.16+, tf-keras): one process, or one trainer of a
MultiWorkerMirroredStrategy cluster (chief and workers, no parameter server).

Every trainer restores the model under the strategy and trains the steps left with model.fit
on its own batches (params["batch_size"] each: the global batch is that times the trainers).
What follows each step is process/task/keras_run.py's, as for Keras 3; each trainer watches
its neighbours (watch_plan.py), and the chief writes the reports (keras_run.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import tensorflow as tf
import tf_keras as keras
from absl import logging
from tensorflow.python.eager import context

from tfconfig_slurm.backends.keras.backend import (
    Saver,
    TrainingBackendBase,
    eval_batches,
    experiment_dataset,
    export,
    write_eval_scalars,
    write_scalars,
)
from tfconfig_slurm.process.records import history, reports
from tfconfig_slurm.process.records.attempts import owns_run
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch, keras_run
from tfconfig_slurm.process.task.keras_run import FitRun, watched_peers
from tfconfig_slurm.process.task.lifecycle import Ending

# How long a trainer waits at the end for the others, before it leaves anyway.
_END_BARRIER_MS = 120_000
# What TensorFlow raises in a trainer whose peer is gone (a SIGKILLed worker's chief:
# UnavailableError, "Socket closed"), where it does not wait for it forever.
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)


class KerasBackend(TrainingBackendBase, FitRun):
    """Keras training as the lifecycle's backend (process/task/lifecycle.py): this trainer's model,
    restored, trained with fit to --train_steps, evaluated and reported."""

    _trainer: _Trainer | None = None

    def start_details(self) -> tuple[str, ...]:
        replicas = self._set_up().strategy.num_replicas_in_sync
        return (f"{replicas} replica{'' if replicas == 1 else 's'}",)

    def _set_up(self) -> _Trainer:
        """The strategy, the model restored, the watch of the neighbours (once)."""
        if self._trainer is not None:
            return self._trainer
        role, directory = self._role, self._settings.model_dir
        # Before any other TensorFlow call, as the strategy requires.
        strategy = (
            tf.distribute.MultiWorkerMirroredStrategy()
            if role is not None
            else tf.distribute.get_strategy()
        )
        peers = watched_peers(role)
        model, saver = self._restored(strategy)
        if role is not None:
            # Every trainer must have restored the same checkpoint. Where the nodes do not
            # share the model directory, a worker finds none where the chief restores one: its
            # replica would train from other weights, and its steps would outlast the chief's,
            # which hangs.
            gather = _collective(strategy, lambda context, step: context.all_gather(step, axis=0))
            starts = gather(tf.constant([saver.last], tf.int64))
            history.check_same_start(directory, [int(step) for step in starts], "trainers")
        writer = tf.summary.create_file_writer(str(directory)) if owns_run(role) else None
        self._trainer = _Trainer(strategy, model, saver, writer, peers)
        # The strategy took SIGTERM as it was made.
        self._stop.listen_again()
        return self._trainer

    def train(self, end: Callable[[Ending], Any]) -> Any:
        trainer, settings, role = self._set_up(), self._settings, self._role
        started, resumed_at = time.monotonic(), trainer.saver.last
        progress = self._fit_steps(
            resumed_at,
            # Of the replicas this process drives (its GPUs, or one).
            examples_per_step=settings.params["batch_size"]
            * (trainer.strategy.num_replicas_in_sync // (role.trainers if role else 1)),
            scalars=(
                None if trainer.writer is None else functools.partial(write_scalars, trainer.writer)
            ),
            sum_votes=None if role is None else _summed_votes(trainer.strategy),
            save=trainer.saver.save,
            # fit's loss is summed over the replicas.
            loss_scale=trainer.strategy.num_replicas_in_sync,
        )

        finish = functools.partial(
            self._fit_ended, progress, (started, resumed_at), end, write_eval_scalars
        )
        try:
            if settings.train_steps <= progress.step:
                return finish()
            inside = _FinishInside(finish)
            hang_watch.began(progress.step)
            # In a cluster each trainer's own batches, sharded by params["trainer_index"]
            # (distribute_datasets_from_function splits no batch).
            batches = functools.partial(
                experiment_dataset, self._experiment, "train", settings.params
            )
            trainer.model.fit(
                batches()
                if role is None
                else trainer.strategy.distribute_datasets_from_function(lambda _: batches()),
                epochs=1,
                steps_per_epoch=settings.train_steps - progress.step,
                callbacks=[keras_run.callback(keras.callbacks.Callback, progress), inside],
                verbose=0,
            )
            return inside.result
        except _PEER_ERRORS as error:
            if trainer.peers is None:
                raise
            trainer.peers.end_for_a_lost_peer(
                f"the trainers' all-reduce failed ({type(error).__name__})", str(error)
            )

    def _evaluated(self, step: int) -> dict[str, Any]:
        trainer = self._set_up()
        trainer.saver.save(step)
        reports.say_evaluating(step, self._settings.eval_steps)
        metrics = trainer.model.evaluate(
            eval_batches(self._experiment, self._settings.params),
            steps=self._settings.eval_steps,
            return_dict=True,
            verbose=0,
        )
        return {**metrics, "global_step": step}

    def _export(self) -> None:
        export(self._set_up().model, self._settings.model_dir, self._experiment.name, self._role)

    def _stop_watching(self) -> None:
        peers = self._set_up().peers
        if peers is not None:
            peers.stop()

    def _end_together(self) -> None:
        """Waits for the other trainers here: a trainer that leaves first fails the others'
        coordination-service heartbeats."""
        if self._role is None:
            return
        try:
            context.context().wait_at_barrier("tfconfig_slurm_end", _END_BARRIER_MS)
        except tf.errors.OpError as error:
            logging.warning("the other trainers did not all reach the end: %s", error.message)


class _Trainer(NamedTuple):
    """This trainer, set up: its strategy, model and saver, the chief's summary writer, and
    the watch of its neighbours in a cluster."""

    strategy: tf.distribute.Strategy
    model: Any
    saver: Saver
    writer: Any
    peers: watchdog.PeerWatch | None


class _FinishInside(keras.callbacks.Callback):  # type: ignore[misc]
    """Ends the run from fit's last callback, before fit returns: leaving fit deletes its
    input iterator, which waits out the tf.data autotuner's sleep (up to a minute); the CLI's
    lifecycle ends the process first (process/exits.py)."""

    def __init__(self, finish: Callable[[], Any]) -> None:
        super().__init__()
        self._finish = finish
        self.result: Any = None

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self.result = self._finish()


def _summed_votes(strategy: tf.distribute.Strategy) -> keras_run.SumVotes:
    """The trainers' votes summed by an all-reduce (keras_run.StepEnds): each local replica of
    a trainer votes as the trainer does."""
    total = _collective(
        strategy, lambda context, votes: context.all_reduce(tf.distribute.ReduceOp.SUM, votes)
    )
    return lambda votes: total(tf.constant([float(vote) for vote in votes]))


def _collective(
    strategy: tf.distribute.Strategy, collect: Callable[[Any, tf.Tensor], tf.Tensor]
) -> Callable[[tf.Tensor], Any]:
    """A function of a tensor that runs `collect(replica context, tensor)` on every replica
    of the trainers, and returns this one's result as numpy. In a graph: run eagerly, each
    all-reduce is slow, and TensorFlow says so each time."""

    def replica(value: tf.Tensor) -> tf.Tensor:
        # The identity: a captured constant has no device to collect from.
        return collect(tf.distribute.get_replica_context(), tf.identity(value))

    graph = tf.function(lambda value: strategy.run(replica, args=(value,)))
    return lambda value: strategy.experimental_local_results(graph(value))[0].numpy()

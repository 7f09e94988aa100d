"""The Estimator backend of the lifecycle that `python -m tfconfig_slurm.run` and
`tfconfig_slurm.train_and_evaluate` share: what to train (`Training`), and this task's role
played to its end. Running again with the same model directory resumes from its latest
checkpoint."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from tfconfig_slurm.backends.estimator import barriers, estimators, evaluator, trainer
from tfconfig_slurm.backends.tf_process import resume_step
from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.job.preemption import StopRequest
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task.lifecycle import Ending, Hparam


@dataclass(frozen=True)
class Training:
    """What to train: an Estimator as its user built it, and train_and_evaluate's specs."""

    estimator: tf.estimator.Estimator
    train_spec: tf.estimator.TrainSpec
    eval_spec: tf.estimator.EvalSpec
    # summary.json's "experiment".
    name: str
    # The run's hparams, as state.json and the runs table show them.
    hparams: Mapping[str, Any]
    # --sync_replicas' chief must close its session at the end, to end its queue runner.
    leave_session_open: bool = True


class EstimatorBackend:
    """Estimator training as the lifecycle's backend (process/task/lifecycle.py)."""

    def __init__(self, training: Training, role: ClusterRole | None, stop: StopRequest) -> None:
        self._training = training
        self._role = role
        self._stop = stop
        self._directory = Path(training.estimator.model_dir)
        self.experiment = training.name
        self.hparams = training.hparams
        self.train_steps: int = training.train_spec.max_steps

    def checkpoint_step(self) -> int | None:
        return resume_step(self._directory)

    def start_details(self) -> tuple[str, ...]:
        return ()

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        """Beside the Estimator's events, whose eval/ scalars are the metrics the HParams tab
        shows (tag and group "eval")."""
        summary = hparams_api.hparams_pb(dict(hparams), trial_id=trial_id)
        # The Estimator's own writer (two starting in one second would share an events file).
        with tf.Graph().as_default():
            writer = tf.compat.v1.summary.FileWriterCache.get(str(self._directory))
        # TensorBoard's Summary proto is not TensorFlow's class: the writer takes its bytes.
        writer.add_summary(summary.SerializeToString())
        writer.flush()

    def train(self, end: Callable[[Ending], Any]) -> Any:
        result = _play(self._training, self._role, self._stop)
        # The event files' writers, closed: the lifecycle may end the process next.
        tf.compat.v1.summary.FileWriterCache.clear()
        return end(Ending(self._stop.signal_name if self._stop.requested else None, result))


def _play(training: Training, role: ClusterRole | None, stop: StopRequest) -> trainer.Result | None:
    """Plays this task's role to its end."""
    if role is None:
        return _train_alone(training, stop)
    if role.role == PS:
        _serve(training.estimator, role)
        return None
    if role.role == EVALUATOR:
        evaluator.run(
            training.estimator, training.eval_spec, training.train_spec.max_steps, role, stop
        )
        return None
    return trainer.run(
        training.estimator,
        training.train_spec,
        training.eval_spec,
        role=role,
        server=_server(training.estimator, role),
        stop=stop,
        name=training.name,
        leave_session_open=training.leave_session_open,
    )


def _train_alone(training: Training, stop: StopRequest) -> trainer.Result | None:
    """Trains and evaluates in this process; None when told to stop before the last step (the
    checkpoint is written, no summary)."""
    started = time.monotonic()
    estimator = estimators.for_task(training.estimator, None)
    throughput = trainer.throughput_hook(estimator, None)
    hooks = [throughput, barriers.PreemptionHook(stop, trainers=1, trainer_id=0)]
    metrics, exports = tf.estimator.train_and_evaluate(
        estimator,
        trainer.with_runtime(training.train_spec, estimator, hooks, stop),
        training.eval_spec,
    )
    if stop.requested:
        return None
    for export in exports or []:
        trainer.log_export(export)
    if metrics is None:
        # No checkpoint was written by this run (max_steps was already reached): evaluate the
        # latest one, so that a resumed run still reports.
        metrics = trainer.evaluate(estimator, training.eval_spec)
    report = {"role": CHIEF, "index": 0, "examples_per_sec": throughput.mean_examples_per_sec()}
    reports.write_summary(
        Path(estimator.model_dir),
        name=training.name,
        metrics=metrics,
        wall_time_s=time.monotonic() - started,
        trainers=[report],
        layout="single process",
    )
    return metrics, list(exports or [])


def _server(estimator: tf.estimator.Estimator, role: ClusterRole) -> tf.distribute.Server:
    """The task's gRPC server, with the session settings (thread limits) of the user's RunConfig."""
    return tf.distribute.Server(
        tf.train.ClusterSpec(role.jobs()),
        job_name=role.role,
        task_index=role.index,
        config=estimator.config.session_config,
        start=True,
    )


def _serve(estimator: tf.estimator.Estimator, role: ClusterRole) -> None:
    """A parameter server: serves until every trainer has finished."""
    server = _server(estimator, role)
    # Its paired trainers, released as their tokens come, and the other parameter servers,
    # which leave only once they hold every token too (watch_plan.py).
    unfinished = watchdog.PeerWatch(watch_plan.paired(role))
    servers = watchdog.PeerWatch(watch_plan.other_servers(role))
    barriers.serve_until_trainers_finish(
        server,
        role.index,
        role.trainers,
        lambda token: unfinished.release(role.trainer_name(token)),
    )
    unfinished.stop()
    servers.stop()

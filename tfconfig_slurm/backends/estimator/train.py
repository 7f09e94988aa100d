"""The Estimator backend of the lifecycle that `python -m tfconfig_slurm.run` and
`tfconfig_slurm.train_and_evaluate` share: what to train (for the CLI, `training`: an
experiment module and its flags made into an Estimator with the flags' RunConfig, as a user's
script would build it, its specs and an exporter for its serving_input_receiver_fn), and this
task's role played to its end. Running again with the same model directory resumes from its
latest checkpoint."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import tensorflow as tf
from absl import logging
from tensorboard.plugins.hparams import api as hparams_api

from tfconfig_slurm.backends.estimator import barriers, trainer
from tfconfig_slurm.backends.estimator.trainer import Training
from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job.preemption import StopRequest
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task.lifecycle import Ending, Hparam, TrainingSettings
from tfconfig_slurm.process.user_code.experiment import Experiment


def training(
    experiment: Experiment, settings: TrainingSettings, role: ClusterRole | None
) -> Training:
    model_fn = experiment.model_fn
    if settings.sync_replicas and role is not None:
        model_fn = barriers.synchronous_model_fn(model_fn, role.trainers, role.trainer_id == 0)
    estimator = tf.estimator.Estimator(
        model_fn=model_fn, config=_run_config(settings), params=dict(settings.params)
    )
    exporters = []
    if experiment.serving_input_receiver_fn is not None:
        exporters.append(
            tf.estimator.FinalExporter(experiment.name, experiment.serving_input_receiver_fn)
        )
    return Training(
        estimator=estimator,
        train_spec=tf.estimator.TrainSpec(
            experiment.train_input_fn, max_steps=settings.train_steps
        ),
        eval_spec=tf.estimator.EvalSpec(
            experiment.eval_input_fn,
            steps=settings.eval_steps,
            exporters=exporters,
        ),
        name=experiment.name,
        hparams={name: settings.params[name] for name in experiment.hparams},
        leave_session_open=not settings.sync_replicas,
    )


def _run_config(settings: TrainingSettings) -> tf.estimator.RunConfig:
    # RunConfig reads None as "never": pass a checkpoint interval only when one is set, so
    # that its default (every 600 s) stands otherwise.
    interval: dict[str, int | None] = {}
    if settings.save_checkpoints_steps is not None:
        interval = {
            "save_checkpoints_steps": settings.save_checkpoints_steps,
            "save_checkpoints_secs": None,
        }
    elif settings.save_checkpoints_secs is not None:
        interval = {"save_checkpoints_secs": settings.save_checkpoints_secs}
    session = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=settings.intra_op_threads,
        inter_op_parallelism_threads=settings.inter_op_threads,
        allow_soft_placement=True,
    )
    session.gpu_options.allow_growth = settings.gpu_memory_growth
    if settings.gpu_memory_fraction is not None:
        session.gpu_options.per_process_gpu_memory_fraction = settings.gpu_memory_fraction
    return tf.estimator.RunConfig(
        model_dir=str(settings.model_dir),
        **interval,
        keep_checkpoint_max=settings.keep_checkpoint_max,
        session_config=session,
        log_step_count_steps=settings.log_every_steps,
        save_summary_steps=settings.log_every_steps,
    )


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
        checkpoint = tf.train.latest_checkpoint(str(self._directory))
        return (
            None if checkpoint is None else int(tf.train.load_variable(checkpoint, "global_step"))
        )

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
        """Plays this task's role to its end."""
        training, role, stop = self._training, self._role, self._stop
        result = None
        if role is None:
            result = _train_alone(training, stop)
        elif role.role == PS:
            _serve(training.estimator, role)
        elif role.role == EVALUATOR:
            _evaluate(training, role, stop)
        else:
            result = trainer.run(training, role, _server(training.estimator, role), stop)
        # The event files' writers, closed: the lifecycle may end the process next.
        tf.compat.v1.summary.FileWriterCache.clear()
        return end(Ending(stop.signal_name if stop.requested else None, result))


def _train_alone(training: Training, stop: StopRequest) -> trainer.Result | None:
    """Trains and evaluates in this process; None when told to stop before the last step (the
    checkpoint is written, no summary)."""
    started = time.monotonic()
    estimator = trainer.for_task(training.estimator, None)
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
    report = {
        "role": CHIEF,
        "index": 0,
        "examples_per_sec": throughput.meter.mean_examples_per_sec(),
    }
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


def _evaluate(training: Training, role: ClusterRole, stop: StopRequest) -> None:
    """The evaluator task: evaluates each new checkpoint of the model directory until one
    reaches the final step (its metrics go to the chief's summary.json), or until it is told
    to stop."""
    # The chief stays until the evaluator has evaluated the final step: if it leaves first, no
    # final checkpoint will come. Told to stop, the chief leaves first.
    watchdog.PeerWatch(
        role.named(CHIEF),
        on_lost=lambda *lost: None if stop.requested else watchdog.exit_on_lost(*lost),
    )
    estimator, eval_spec = trainer.for_task(training.estimator, None), training.eval_spec
    train_steps, model_dir = training.train_spec.max_steps, Path(estimator.model_dir)
    for checkpoint in tf.train.checkpoints_iterator(
        str(model_dir), timeout=timing.CHECKPOINT_LOOK_SECONDS, timeout_fn=lambda: stop.requested
    ):
        metrics = estimator.evaluate(
            eval_spec.input_fn,
            steps=eval_spec.steps,
            checkpoint_path=checkpoint,
            hooks=eval_spec.hooks,
            name=eval_spec.name,
        )
        step = int(metrics["global_step"])
        logging.info("evaluator 0: step %d: %s", step, reports.metric_text(metrics))
        if step >= train_steps:
            reports.write_evaluator_result(model_dir, reports.marker(role, train_steps), metrics)
            return

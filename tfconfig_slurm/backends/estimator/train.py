"""One task's run from its place to its end, the same for `python -m tfconfig_slurm.run` and
for `tfconfig_slurm.train_and_evaluate`: the model directory held, the role played (a single
process, a parameter server, a trainer, the evaluator), and what a stop on a signal asks for.

Checkpoints and event files live in the Estimator's model directory; running again with the
same directory resumes from its latest checkpoint.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
from absl import logging
from tensorboard.plugins.hparams import api as hparams_api

from tfconfig_slurm.backends.estimator import estimators, evaluator, lifecycle, trainer
from tfconfig_slurm.backends.tf_process import exit_now, resume_step
from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import claim, model_dir, preemption, reports, watchdog
from tfconfig_slurm.process.owner import RunOwner, owns_run
from tfconfig_slurm.process.place import Place


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


def run(
    training: Training,
    place: Place,
    stop: lifecycle.StopRequest,
    stop_policy: preemption.StopPolicy,
    naming: claim.Naming,
) -> trainer.Result | None:
    """Runs this task to its end. A single process and the chief return what
    tf.estimator.train_and_evaluate returns in one process; a worker and the evaluator return
    None; a parameter server, and any task told to stop, end the process instead."""
    role = place.role
    if role is not None and role.ps_count == 0:
        raise UsageError(
            place.layout_source,
            "gives a cluster without parameter servers, which Estimator training needs",
            "a parameter server on each node is the default; drop the setting that removed them",
        )
    directory = Path(training.estimator.model_dir)
    # Only now, with the input checked: bad input leaves nothing behind.
    held = model_dir.hold(directory, role, naming)
    resumed = resume_step(directory)
    place.log_start(directory, resumed)
    if owns_run(role):
        result = _play_as_owner(directory, training, role, stop)
    else:
        result = _play(training, role, stop)
    if role is not None:
        logging.info("%s %d: done", role.role, role.index)
    # A run stopped on a signal keeps its directory, to resume there (as a requeued job).
    if held is not None and not stop.requested:
        held.release()
    if stop.requested:
        # The first ps sees every trainer finish, so it is the one to requeue the job.
        requeues = role is None or (role.role == PS and role.index == 0)
        status = 0
        if requeues:
            status = preemption.after_stop(
                os.environ, stop.signal_name, stop_policy.requeue_on, stop_policy.max_requeues
            )
        exit_now(status)
    if role is not None and role.role == PS:
        exit_now(0)
    return result


def _play_as_owner(
    directory: Path, training: Training, role: ClusterRole | None, stop: lifecycle.StopRequest
) -> trainer.Result | None:
    """Plays the role of the task that owns the run (the chief, a single process), saying in
    state.json what the run does, and giving TensorBoard its hparams at its first start."""
    owner = RunOwner(directory, training.name, training.hparams, role)
    first = owner.first_start()
    owner.say("running", resume_step(directory))
    with owner.failing_on_error(lambda: resume_step(directory)):
        if first:
            _hparams_for_tensorboard(training.estimator.model_dir, owner)
        result = _play(training, role, stop)
    if stop.requested:
        owner.say("stopped", resume_step(directory), signal=stop.signal_name)
    else:
        owner.say("done", resume_step(directory))
    return result


def _play(
    training: Training, role: ClusterRole | None, stop: lifecycle.StopRequest
) -> trainer.Result | None:
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


def _hparams_for_tensorboard(directory: str, owner: RunOwner) -> None:
    """The run's hparams, once, where TensorBoard's HParams dashboard finds them: beside the
    Estimator's events, whose eval/ scalars are the metrics it shows (tag and group "eval")."""
    summary = hparams_api.hparams_pb(owner.hparams_for_tensorboard(), trial_id=Path(directory).name)
    # The Estimator's own writer of the directory, by the very name it uses: two writers
    # starting in one second would write one events file. Made outside eager mode.
    with tf.Graph().as_default():
        writer = tf.compat.v1.summary.FileWriterCache.get(directory)
    # TensorBoard's Summary proto is not TensorFlow's class: the writer takes its bytes.
    writer.add_summary(summary.SerializeToString())
    writer.flush()


def _train_alone(training: Training, stop: lifecycle.StopRequest) -> trainer.Result | None:
    """Trains and evaluates in this process; None when told to stop before the last step (the
    checkpoint is written, no summary)."""
    started = time.monotonic()
    estimator = estimators.for_task(training.estimator, None)
    throughput = trainer.throughput_hook(estimator, None)
    hooks = [throughput, lifecycle.PreemptionHook(stop, trainers=1, trainer_id=0)]
    metrics, exports = tf.estimator.train_and_evaluate(
        estimator, trainer.with_hooks(training.train_spec, hooks), training.eval_spec
    )
    if stop.requested:
        return None
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
    lifecycle.serve_until_trainers_finish(
        server,
        role.index,
        role.trainers,
        lambda token: unfinished.release(role.trainer_name(token)),
    )
    unfinished.stop()
    servers.stop()

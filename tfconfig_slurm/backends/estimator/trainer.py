"""A trainer of the cluster (the chief or a worker): train_and_evaluate with the runtime's
hooks, the stop tokens for the parameter servers and its report; the chief then evaluates,
exports and writes summary.json.

The runtime's session hooks on every trainer: throughput, logged and written as scalars, and
the chief's checkpoints, timed. A step's examples are counted in the graph, from its input's
batch dimension, so that a script need not say its batch size and a short batch counts as such.

A user's Estimator is remade for each task (for_task): RunConfig reads TF_CONFIG once, when
made, so one built in a user's script before the runtime knew the task describes no cluster
(or another). The new one keeps the user's model_fn, params, warm start and RunConfig
settings; the cluster decides only the cluster, task and device filters.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf
from absl import logging

from tfconfig_slurm.backends.estimator import barriers
from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.throughput import Rates, Throughput


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


# What tf.estimator.train_and_evaluate returns: the final metrics and the exporters' results.
Result = tuple[dict[str, Any] | None, list[Any]]
# Ops that hand a step its input, as Estimator's input functions build them.
_INPUT_OPS = ("IteratorGetNext", "QueueDequeueManyV2", "QueueDequeueUpToV2")
# The user's RunConfig settings that a task's Estimator keeps (for_task).
_KEPT_SETTINGS = (
    "model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
    "save_checkpoints_secs", "keep_checkpoint_max", "keep_checkpoint_every_n_hours",
    "log_step_count_steps", "train_distribute", "device_fn", "protocol", "eval_distribute",
    "session_creation_timeout_secs", "checkpoint_save_graph_def",
)  # fmt: skip


def run(
    training: Training,
    role: ClusterRole,
    server: tf.distribute.Server,
    stop: preemption.StopRequest,
) -> Result | None:
    """Trains as `role` through `server`, the task's own, which carries the thread limits
    ("environment": "google" in TF_CONFIG keeps the Estimator from starting one). The chief
    returns what train_and_evaluate returns in one process; a worker, or a chief told to
    stop, None."""
    user, train_spec = training.estimator, training.train_spec
    started = time.monotonic()
    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(user.config.session_config)
    # Without device filters a trainer would wait for every other trainer.
    if not config.device_filters:
        config.device_filters.extend(["/job:ps", f"/job:{role.role}/task:{role.index}"])
    model_dir = Path(user.model_dir)
    throughput = throughput_hook(user, role)
    # A lost peer reaches this trainer through the parameter servers it is paired with.
    peers = watchdog.PeerWatch(watch_plan.paired(role))
    barrier = barriers.StartBarrierHook(server.target, role.trainers, role.trainer_id)
    hooks = [throughput, barrier, barriers.PreemptionHook(stop, role.trainers, role.trainer_id)]
    if training.leave_session_open:
        hooks.append(barriers.LeaveSessionOpenHook())
    tf_config = role.tf_config(environment="google")
    estimator = for_task(user, tf_config, config)
    try:
        with tf_config_environment(tf_config):
            tf.estimator.train_and_evaluate(
                estimator, with_runtime(train_spec, estimator, hooks, stop), training.eval_spec
            )
    finally:
        # Also when training failed or had nothing left: the ps must not wait for this trainer.
        barriers.send_stop_tokens(server.target, role.ps_count, role.trainers, role.trainer_id)
        # Only now: a ps that died meanwhile would hold the tokens' session forever.
        peers.stop()
        logging.info("%s %d: told %d ps it is done", role.role, role.index, role.ps_count)
    run_marker = reports.marker(role, train_spec.max_steps)
    mean = throughput.meter.mean_examples_per_sec()
    reports.write_trainer_report(model_dir, role, run_marker, mean)
    if role.role != CHIEF:
        return None
    if stop.requested:
        logging.info(
            "chief 0: stopped on %s; the final evaluation and summary.json come with the run "
            "that reaches step %d",
            stop.signal_name,
            train_spec.max_steps,
        )
        return None
    return _reported(training, role, run_marker, started)


def _reported(
    training: Training, role: ClusterRole, run_marker: dict[str, Any], started: float
) -> Result:
    """The chief's end of a run trained to its last step: its metrics (the evaluator's, else
    the final checkpoint evaluated here with no cluster, whose ps may be gone), exports and
    summary (in a cluster the Estimator's chief does not evaluate)."""
    model_dir = Path(training.estimator.model_dir)
    local = for_task(training.estimator, None)
    evaluated = reports.evaluator_result(model_dir, run_marker) if role.has_evaluator else None
    metrics = evaluated or evaluate(local, training.eval_spec)
    exports = export(local, training.eval_spec, metrics)
    reports.write_summary(
        model_dir,
        name=training.name,
        metrics=metrics,
        wall_time_s=time.monotonic() - started,
        trainers=reports.trainer_reports(model_dir, role.trainers, run_marker),
        layout=role.jobs(),
    )
    return metrics, exports


def evaluate(estimator: tf.estimator.Estimator, eval_spec: tf.estimator.EvalSpec) -> dict[str, Any]:
    """The metrics of the latest checkpoint, as `eval_spec` evaluates."""
    metrics: dict[str, Any] = estimator.evaluate(
        eval_spec.input_fn, steps=eval_spec.steps, hooks=eval_spec.hooks, name=eval_spec.name
    )
    return metrics


def export(
    estimator: tf.estimator.Estimator, eval_spec: tf.estimator.EvalSpec, metrics: dict[str, Any]
) -> list[Any]:
    """Runs `eval_spec`'s exporters on the final checkpoint, as train_and_evaluate does after
    its final evaluation; returns their results."""
    checkpoint = tf.train.latest_checkpoint(estimator.model_dir)
    results = []
    for exporter in eval_spec.exporters:
        path = RunDir(Path(estimator.model_dir)).export(exporter.name)
        result = exporter.export(estimator, str(path), checkpoint, metrics, True)
        log_export(result)
        results.append(result)
    return results


def throughput_hook(estimator: tf.estimator.Estimator, role: ClusterRole | None) -> ThroughputHook:
    """Logs every RunConfig.log_step_count_steps steps. The chief writes its scalars beside the
    Estimator's events, by the directory's very name (the same writer); another trainer into
    a directory of its own: v1 event file names carry only the second and the host."""
    summaries: str = estimator.model_dir
    if role is not None and role.role != CHIEF:
        summaries = str(Path(summaries, f"{role.role}-{role.index}"))
    every = estimator.config.log_step_count_steps or 100
    return ThroughputHook(summaries, every)


def with_runtime(
    spec: tf.estimator.TrainSpec,
    estimator: tf.estimator.Estimator,
    hooks: list[Any],
    stop: preemption.StopRequest,
) -> tf.estimator.TrainSpec:
    """The user's TrainSpec with the runtime's hooks, and its checkpoints timed where the
    estimator writes any (Estimator refuses a listener where no hook saves)."""
    config = estimator.config
    timed = (
        (CheckpointTimer(stop),)
        if config.save_checkpoints_steps or config.save_checkpoints_secs
        else ()
    )
    return spec._replace(
        hooks=(*spec.hooks, *hooks), saving_listeners=(*spec.saving_listeners, *timed)
    )


def log_export(result: Any) -> None:
    """Says where an exporter's result (a path, as bytes or text) went; None: not exported
    (BestExporter, for a model no better)."""
    if result is not None:
        logging.info(
            "exported the model to %s", result.decode() if isinstance(result, bytes) else result
        )


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Feeds the runtime's throughput meter (process/task/throughput.py) from each step, and
    writes the speeds as scalars (Estimator writes the loss); at the end, the run's means."""

    def __init__(self, summary_dir: str, every_steps: int) -> None:
        self._summary_dir = summary_dir
        self._every_steps = every_steps
        self._writer: Any | None = None
        self._fetches: dict[str, Any] = {}
        self.meter = Throughput(every_steps)

    def begin(self) -> None:
        self._fetches = {"step": tf.compat.v1.train.get_global_step()}
        # Estimator puts the EstimatorSpec's loss last, after any tf.compat.v1.losses added.
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        if losses:
            self._fetches["loss"] = losses[-1]
        batch = _batch_size()
        if batch is not None:
            self._fetches["examples"] = batch
        self.meter = Throughput(self._every_steps, counts_examples=batch is not None)
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)

    def after_create_session(self, session: Any, coord: Any) -> None:
        hang_watch.began(int(session.run(self._fetches["step"])))

    def before_run(self, run_context: Any) -> tf.compat.v1.train.SessionRunArgs:
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        results = run_values.results
        step = int(results["step"])
        hang_watch.stepped(step)
        loss = float(results["loss"]) if "loss" in results else None
        rates = self.meter.step(step, int(results.get("examples", 0)), loss)
        if rates is not None:
            self._record(rates, step)

    def end(self, session: Any) -> None:
        hang_watch.paused()
        mean = self.meter.end()
        if mean is not None and self.meter.global_step is not None:
            self._record(mean, self.meter.global_step)
        if self._writer is not None:
            self._writer.flush()

    def _record(self, rates: Rates, step: int) -> None:
        assert self._writer is not None
        values = {"global_steps_per_sec": rates.global_steps_per_sec}
        if rates.examples_per_sec is not None:
            values["examples_per_sec"] = rates.examples_per_sec
        self._writer.add_summary(
            tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                    for tag, value in values.items()
                ]
            ),
            step,
        )


def _batch_size() -> tf.Tensor | None:
    """The number of examples in the step's input, or None where no input op is found."""
    for op in tf.compat.v1.get_default_graph().get_operations():
        if op.type in _INPUT_OPS:
            # Sparse components travel as variants; the batch dimension is a dense one's.
            dense = [tensor for tensor in op.outputs if tensor.dtype != tf.variant]
            if dense and dense[0].shape.rank:
                return tf.shape(dense[0], out_type=tf.int64)[0]
    return None


class CheckpointTimer(tf.compat.v1.train.CheckpointSaverListener):
    """Times each checkpoint the chief writes, for the stop before the time limit
    (process/job/preemption.py). The hang watch rests from a checkpoint to the next step: a
    single process's train_and_evaluate evaluates there."""

    def __init__(self, stop: preemption.StopRequest) -> None:
        self._stop = stop
        self._started = 0.0

    def before_save(self, session: Any, global_step_value: int) -> None:
        hang_watch.paused()
        self._started = time.monotonic()

    def after_save(self, session: Any, global_step_value: int) -> None:
        self._stop.checkpoint_written(global_step_value, time.monotonic() - self._started)


def for_task(
    user: tf.estimator.Estimator,
    tf_config: Mapping[str, Any] | None,
    session_config: tf.compat.v1.ConfigProto | None = None,
) -> tf.estimator.Estimator:
    """`user`'s Estimator under `tf_config` (None: this process alone), with `session_config`
    in place of its own when given."""
    config = user.config
    kept = {name: getattr(config, name) for name in _KEPT_SETTINGS}
    with tf_config_environment(tf_config):
        run_config = tf.estimator.RunConfig(
            **kept,
            session_config=session_config or config.session_config,
            # Workers wait for the chief at the start barrier instead of sleeping 5 s x index.
            experimental_max_worker_delay_secs=0,
        )
    bound = user.model_fn

    def model_fn(features: Any, labels: Any, mode: str, params: Any, config: Any) -> Any:
        # The user's params are bound to model_fn; the new Estimator gets them for its input_fns.
        del params
        return bound(features, labels, mode, config)

    return tf.estimator.Estimator(
        model_fn=model_fn,
        config=run_config,
        params=user.params,
        warm_start_from=user._warm_start_settings,
    )


@contextlib.contextmanager
def tf_config_environment(tf_config: Mapping[str, Any] | None) -> Iterator[None]:
    """TF_CONFIG as RunConfig and train_and_evaluate read it, for the duration of the block."""
    saved = os.environ.pop("TF_CONFIG", None)
    if tf_config is not None:
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    try:
        yield
    finally:
        os.environ.pop("TF_CONFIG", None)
        if saved is not None:
            os.environ["TF_CONFIG"] = saved

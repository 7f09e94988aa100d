"""A trainer of the cluster (the chief or a worker): train_and_evaluate with the runtime's
hooks, the stop tokens for the parameter servers and its report; the chief then evaluates,
exports and writes summary.json."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import tensorflow as tf
from absl import logging

from tfconfig_slurm.backends.estimator import barriers, estimators
from tfconfig_slurm.backends.estimator.hooks import CheckpointTimer, ThroughputHook
from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import watchdog

# What tf.estimator.train_and_evaluate returns: the final metrics and the exporters' results.
Result = tuple[dict[str, Any] | None, list[Any]]


def run(
    user: tf.estimator.Estimator,
    train_spec: tf.estimator.TrainSpec,
    eval_spec: tf.estimator.EvalSpec,
    *,
    role: ClusterRole,
    server: tf.distribute.Server,
    stop: preemption.StopRequest,
    name: str,
    leave_session_open: bool,
) -> Result | None:
    """Trains as `role` through `server`, the task's own, which carries the thread limits
    ("environment": "google" in TF_CONFIG keeps the Estimator from starting one). The chief
    returns what train_and_evaluate returns in one process; a worker, or a chief told to
    stop, None."""
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
    if leave_session_open:
        hooks.append(barriers.LeaveSessionOpenHook())
    tf_config = role.tf_config(environment="google")
    estimator = estimators.for_task(user, tf_config, config)
    try:
        with estimators.tf_config_environment(tf_config):
            tf.estimator.train_and_evaluate(
                estimator, with_runtime(train_spec, estimator, hooks, stop), eval_spec
            )
    finally:
        # Also when training failed or had nothing left: the ps must not wait for this trainer.
        barriers.send_stop_tokens(server.target, role.ps_count, role.trainers, role.trainer_id)
        # Only now: a ps that died meanwhile would hold the tokens' session forever.
        peers.stop()
        logging.info("%s %d: told %d ps it is done", role.role, role.index, role.ps_count)
    run_marker = reports.marker(role, train_spec.max_steps)
    reports.write_trainer_report(model_dir, role, run_marker, throughput.mean_examples_per_sec())
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
    return _reported(user, eval_spec, role, run_marker=run_marker, name=name, started=started)


def _reported(
    user: tf.estimator.Estimator,
    eval_spec: tf.estimator.EvalSpec,
    role: ClusterRole,
    *,
    run_marker: dict[str, Any],
    name: str,
    started: float,
) -> Result:
    """The chief's end of a run trained to its last step: its metrics (the evaluator's, else
    the final checkpoint evaluated here with no cluster, whose ps may be gone), exports and
    summary (in a cluster the Estimator's chief does not evaluate)."""
    model_dir = Path(user.model_dir)
    local = estimators.for_task(user, None)
    evaluated = reports.evaluator_result(model_dir, run_marker) if role.has_evaluator else None
    metrics = evaluated or evaluate(local, eval_spec)
    exports = export(local, eval_spec, metrics)
    reports.write_summary(
        model_dir,
        name=name,
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

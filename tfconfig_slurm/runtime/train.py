"""Training one experiment with tf.estimator: the RunConfig, train_and_evaluate, summary.json.

Checkpoints and event files live in the model directory, `<output root>/<experiment id>`;
running again with the same directory resumes from its latest checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

import tensorflow as tf
from absl import logging
from tensorflow.python.util import deprecation

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER
from tfconfig_slurm.runtime import lifecycle, sync, watchdog
from tfconfig_slurm.runtime.experiment import Experiment
from tfconfig_slurm.runtime.hooks import ThroughputHook
from tfconfig_slurm.runtime.role import ClusterRole

SUMMARY_FILE = "summary.json"

# Estimator's own INFO lines (every graph build, every checkpoint) drown the runtime's; its
# warnings still show. --verbosity=1 does not bring them back: they are TensorFlow's logger.
tf.get_logger().setLevel("WARNING")
# Estimator is deprecated as a whole, and TensorFlow 2.15 says so at every call of its API:
# users of this runtime chose it knowingly. The switch is private, but TensorFlow is pinned.
deprecation._PRINT_DEPRECATION_WARNINGS = False


@dataclass(frozen=True)
class TrainingSettings:
    """How to train: the flags of `python -m tfconfig_slurm.run` that are not the layout's."""

    model_dir: Path
    train_steps: int
    eval_steps: int | None
    batch_size: int
    params: Mapping[str, Any]
    save_checkpoints_steps: int | None
    save_checkpoints_secs: int | None
    keep_checkpoint_max: int
    intra_op_threads: int
    inter_op_threads: int
    gpu_memory_growth: bool
    gpu_memory_fraction: float | None
    log_every_steps: int
    sync_replicas: bool


def session_config(settings: TrainingSettings) -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=settings.intra_op_threads,
        inter_op_parallelism_threads=settings.inter_op_threads,
        allow_soft_placement=True,
    )
    config.gpu_options.allow_growth = settings.gpu_memory_growth
    if settings.gpu_memory_fraction is not None:
        config.gpu_options.per_process_gpu_memory_fraction = settings.gpu_memory_fraction
    return config


def hold_threads(settings: TrainingSettings) -> None:
    """Holds this process's thread pools to the thread flags; call it before TensorFlow runs
    anything.

    TensorFlow 2 makes a process's thread pools once, as its eager context says, and a
    Session's ConfigProto does not resize them: a single process given --intra_op_threads=1
    --inter_op_threads=1 still kept 1.7 cores busy here (3080 examples/s; 2100 when held).
    """
    tf.config.threading.set_intra_op_parallelism_threads(settings.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(settings.inter_op_threads)


def resume_step(model_dir: Path) -> int | None:
    """The global step of the latest checkpoint in `model_dir`, or None without one."""
    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    if checkpoint is None:
        return None
    return int(tf.train.load_variable(checkpoint, "global_step"))


def train_single_process(
    experiment: Experiment, settings: TrainingSettings, stop: lifecycle.StopRequest
) -> dict[str, Any] | None:
    """Trains and evaluates in this process; returns what it wrote to summary.json, or None
    when told to stop before the last step (the checkpoint is written, no summary)."""
    started = time.monotonic()
    estimator = _estimator(experiment, settings, session_config(settings))
    throughput = _throughput(settings)
    hooks = [throughput, lifecycle.PreemptionHook(stop, trainers=1, trainer_id=0)]
    metrics, _ = tf.estimator.train_and_evaluate(estimator, *_specs(experiment, settings, hooks))
    if stop.requested:
        return None
    trainer = {"role": CHIEF, "index": 0, "examples_per_sec": throughput.mean_examples_per_sec()}
    return _finish(
        experiment,
        settings,
        estimator=estimator,
        metrics=metrics,
        started=started,
        trainers=[trainer],
        layout="single process",
    )


def run_role(
    experiment: Experiment,
    settings: TrainingSettings,
    role: ClusterRole,
    stop: lifecycle.StopRequest,
) -> None:
    """Runs this task's part of a cluster: a parameter server, a trainer, or the evaluator.
    Told to stop, trainers stop at the next step boundary, after the chief's checkpoint."""
    if role.role == EVALUATOR:
        # The chief stays until the evaluator has evaluated the final step: if it leaves
        # first, no final checkpoint will come. Told to stop, the chief leaves first.
        watchdog.PeerWatch(
            role.named(CHIEF),
            on_lost=lambda *lost: None if stop.requested else watchdog.exit_on_lost(*lost),
        )
        _evaluate_until_final_step(experiment, settings, _run_marker(settings, role), stop)
        return
    config = session_config(settings)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(role.jobs()),
        job_name=role.role,
        task_index=role.index,
        config=config,
        start=True,
    )
    if role.role == PS:
        unfinished = watchdog.PeerWatch(role.named(CHIEF, WORKER))
        lifecycle.serve_until_trainers_finish(
            server,
            role.index,
            role.trainers,
            lambda token: unfinished.release(role.trainer_name(token)),
        )
        unfinished.stop()
        return
    started = time.monotonic()
    # The runtime owns the server, which carries the thread limits; "environment": "google"
    # makes the Estimator use it instead of starting one of its own. Without explicit device
    # filters a session_config lets a trainer wait for every other trainer.
    own_device = f"/job:{role.role}/task:{role.index}"
    config.device_filters.extend(["/job:ps", own_device])
    model_fn = experiment.model_fn
    if settings.sync_replicas:
        model_fn = sync.synchronous_model_fn(model_fn, role.trainers, role.role == CHIEF)
    throughput = _throughput(settings, role)
    # A trainer waits on every ps, and a worker on the chief until the chief lets it start.
    peers = watchdog.PeerWatch(role.named(PS, CHIEF) if role.role == WORKER else role.named(PS))
    hook = lifecycle.StartBarrierHook(
        server.target, role.trainers, role.trainer_id, lambda: peers.release(f"{CHIEF} 0")
    )
    hooks = [throughput, hook, lifecycle.PreemptionHook(stop, role.trainers, role.trainer_id)]
    if not settings.sync_replicas:
        # With --sync_replicas the chief must close it, to end its queue runner (sync.py).
        hooks.append(lifecycle.LeaveSessionOpenHook())
    with _tf_config_environment(role.tf_config(environment="google")):
        try:
            tf.estimator.train_and_evaluate(
                _estimator(experiment, settings, config, model_fn),
                *_specs(experiment, settings, hooks),
            )
        finally:
            # Once training has ended (the chief's final checkpoint written), from a session
            # of its own; also when training failed or there was nothing left to train: the
            # parameter servers must not wait for this trainer.
            lifecycle.send_stop_tokens(server.target, role.ps_count, role.trainers, role.trainer_id)
            # Only now: a ps that died meanwhile would hold the tokens' session forever.
            peers.stop()
            logging.info("%s %d: told %d ps it is done", role.role, role.index, role.ps_count)
    marker = _run_marker(settings, role)
    report = {
        "role": role.role,
        "index": role.index,
        "examples_per_sec": throughput.mean_examples_per_sec(),
        **marker,
    }
    reports = settings.model_dir / _TRAINER_REPORTS
    reports.mkdir(exist_ok=True)
    write_json_atomically(reports / f"{role.role}-{role.index}.json", report)
    if role.role == CHIEF and stop.requested:
        logging.info(
            "chief 0: stopped on %s; the final evaluation and summary.json come with the run "
            "that reaches step %d",
            stop.signal_name,
            settings.train_steps,
        )
    elif role.role == CHIEF:
        # In a cluster the Estimator's chief does not evaluate. Without an evaluator task it
        # evaluates the final checkpoint here, in-process and with no cluster (the parameter
        # servers may be gone by now); with one, it takes the evaluator's final result.
        with _tf_config_environment(None):
            local = _estimator(experiment, settings, session_config(settings))
            if role.has_evaluator:
                metrics = _evaluator_result(settings.model_dir, marker)
            else:
                metrics = local.evaluate(experiment.eval_input_fn, steps=settings.eval_steps)
            trainers = _trainer_reports(reports, role.trainers, marker)
            _finish(
                experiment,
                settings,
                estimator=local,
                metrics=metrics,
                started=started,
                trainers=trainers,
                layout=role.jobs(),
            )


# How long the chief waits for the other trainers' throughput reports for summary.json.
_REPORT_WAIT_SECONDS = 30.0
_TRAINER_REPORTS = "trainers"
# The evaluator's metrics of the final checkpoint, which the chief puts into summary.json.
_EVALUATOR_RESULT = "evaluator.json"
# How long the chief waits for them: the evaluator may be busy with an earlier checkpoint.
_EVALUATOR_WAIT_SECONDS = 600.0


def _run_marker(settings: TrainingSettings, role: ClusterRole) -> dict[str, Any]:
    """What the reports a task leaves in the model directory carry, so that the chief takes
    this run's only: the cluster's run id, and the step it trains to (all there is to go by
    with a TF_CONFIG made elsewhere, which has no run id)."""
    return {"run": role.run_id, "train_steps": settings.train_steps}


def _of_run(report: Mapping[str, Any], marker: Mapping[str, Any]) -> bool:
    return all(report.get(key) == value for key, value in marker.items())


def _evaluate_until_final_step(
    experiment: Experiment,
    settings: TrainingSettings,
    marker: Mapping[str, Any],
    stop: lifecycle.StopRequest,
) -> None:
    """The evaluator: evaluates each new checkpoint until one reaches the final step, or
    until it is told to stop."""
    with _tf_config_environment(None):
        estimator = _estimator(experiment, settings, session_config(settings))
        # The iterator looks every second; a timeout shorter than two of its looks would
        # make it return at once, over and over.
        for checkpoint in tf.train.checkpoints_iterator(
            str(settings.model_dir), timeout=2.0, timeout_fn=lambda: stop.requested
        ):
            metrics = estimator.evaluate(
                experiment.eval_input_fn, steps=settings.eval_steps, checkpoint_path=checkpoint
            )
            step = int(metrics["global_step"])
            logging.info("evaluator 0: step %d: %s", step, metric_text(metrics))
            if step >= settings.train_steps:
                result = {name: float(value) for name, value in metrics.items()}
                write_json_atomically(
                    settings.model_dir / _EVALUATOR_RESULT, {**marker, "metrics": result}
                )
                return


def _evaluator_result(model_dir: Path, marker: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics this run's evaluator wrote: of the first checkpoint at or past the final
    step, which asynchronous workers may have left a step or two before the chief's very
    last one."""
    path = model_dir / _EVALUATOR_RESULT

    def result() -> dict[str, Any] | None:
        return json.loads(path.read_text()) if path.exists() else None

    final = lifecycle.poll(
        result,
        lambda value: value is not None and _of_run(value, marker),
        _EVALUATOR_WAIT_SECONDS,
    )
    if final is None or not _of_run(final, marker):
        logging.warning(
            "the evaluator gave no result for step %d within %.0f s",
            marker["train_steps"],
            _EVALUATOR_WAIT_SECONDS,
        )
        return {"global_step": marker["train_steps"]}
    metrics: dict[str, Any] = final["metrics"]
    return metrics


def metric_text(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {float(value):.4g}" for name, value in sorted(metrics.items()))


def _trainer_reports(
    folder: Path, trainers: int, marker: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Every trainer's report of this run, waiting a while for the ones not yet written."""

    def current() -> list[dict[str, Any]]:
        reports = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
        return [report for report in reports if _of_run(report, marker)]

    return lifecycle.poll(current, lambda reports: len(reports) >= trainers, _REPORT_WAIT_SECONDS)


@contextlib.contextmanager
def _tf_config_environment(tf_config: dict[str, Any] | None) -> Iterator[None]:
    """TF_CONFIG as RunConfig and train_and_evaluate read it, for the duration of the block."""
    saved = os.environ.get("TF_CONFIG")
    if tf_config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = saved


def _estimator(
    experiment: Experiment,
    settings: TrainingSettings,
    config: tf.compat.v1.ConfigProto,
    model_fn: Callable[..., Any] | None = None,
) -> tf.estimator.Estimator:
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
    return tf.estimator.Estimator(
        model_fn=model_fn or experiment.model_fn,
        config=tf.estimator.RunConfig(
            model_dir=str(settings.model_dir),
            **interval,
            keep_checkpoint_max=settings.keep_checkpoint_max,
            session_config=config,
            log_step_count_steps=settings.log_every_steps,
            save_summary_steps=settings.log_every_steps,
            # Workers wait for the chief at the start barrier instead of sleeping 5 s x index.
            experimental_max_worker_delay_secs=0,
        ),
        params=dict(settings.params),
    )


def _throughput(settings: TrainingSettings, role: ClusterRole | None = None) -> ThroughputHook:
    # The chief writes into the model directory, beside the Estimator's own events; another
    # trainer into a directory of its own: v1 event file names carry only the second and
    # the host, so two writers starting together on one host would write one file.
    summaries = settings.model_dir
    if role is not None and role.role != CHIEF:
        summaries = summaries / f"{role.role}-{role.index}"
    return ThroughputHook(settings.batch_size, str(summaries), settings.log_every_steps)


def _specs(
    experiment: Experiment, settings: TrainingSettings, hooks: list[Any]
) -> tuple[tf.estimator.TrainSpec, tf.estimator.EvalSpec]:
    return (
        tf.estimator.TrainSpec(
            experiment.train_input_fn, max_steps=settings.train_steps, hooks=hooks
        ),
        tf.estimator.EvalSpec(experiment.eval_input_fn, steps=settings.eval_steps),
    )


def _finish(
    experiment: Experiment,
    settings: TrainingSettings,
    *,
    estimator: tf.estimator.Estimator,
    metrics: Mapping[str, Any] | None,
    started: float,
    trainers: list[dict[str, Any]],
    layout: Any,
) -> dict[str, Any]:
    """Exports the model and writes summary.json; returns the summary."""
    if metrics is None:
        # No checkpoint was written by this run (max_steps was already reached): evaluate the
        # latest one, so that a resumed run still reports.
        metrics = estimator.evaluate(experiment.eval_input_fn, steps=settings.eval_steps)
    if experiment.serving_input_receiver_fn is not None:
        exported = estimator.export_saved_model(
            str(settings.model_dir / "export"), experiment.serving_input_receiver_fn
        )
        logging.info("exported the model to %s", exported.decode())
    summary = {
        "experiment": experiment.name,
        "global_step": int(metrics["global_step"]),
        "wall_time_s": round(time.monotonic() - started, 3),
        "trainers": trainers,
        "eval": {name: float(value) for name, value in metrics.items()},
        "layout": layout,
    }
    write_json_atomically(settings.model_dir / SUMMARY_FILE, summary)
    return summary


def exit_now(status: int = 0) -> NoReturn:
    """Ends this finished process with `status` at once, once all it wrote is out.

    Shutting down an interpreter that imported TensorFlow took 0.6-1.7 s here (1.2 s for a
    chief, 1.7 s for a worker at the end of a local cluster), the largest part of a
    cluster's teardown, and a ps's gRPC server cannot be stopped anyway; nothing of that
    shutdown is work this process still owes.
    """
    tf.compat.v1.summary.FileWriterCache.clear()
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def write_json_atomically(path: Path, value: Any) -> None:
    """Writes `value` as JSON so that a reader never sees a half-written file."""
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as stream:
        json.dump(value, stream, indent=1)
        stream.write("\n")
    # NamedTemporaryFile makes the file private (0600); give it the mode a plain open would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stream.name, 0o666 & ~umask)
    os.replace(stream.name, path)

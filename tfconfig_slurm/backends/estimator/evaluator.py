"""The evaluator task: evaluates each new checkpoint of the model directory until one reaches
the final step (its metrics go to the chief's summary.json), or until it is told to stop."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf
from absl import logging

from tfconfig_slurm.backends.estimator import estimators
from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.supervision import watchdog


def run(
    user: tf.estimator.Estimator,
    eval_spec: tf.estimator.EvalSpec,
    train_steps: int,
    role: ClusterRole,
    stop: preemption.StopRequest,
) -> None:
    # The chief stays until the evaluator has evaluated the final step: if it leaves first, no
    # final checkpoint will come. Told to stop, the chief leaves first.
    watchdog.PeerWatch(
        role.named(CHIEF),
        on_lost=lambda *lost: None if stop.requested else watchdog.exit_on_lost(*lost),
    )
    estimator = estimators.for_task(user, None)
    model_dir = Path(estimator.model_dir)
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

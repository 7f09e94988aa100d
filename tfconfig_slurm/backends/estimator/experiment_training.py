"""An experiment module and `python -m tfconfig_slurm.run`'s flags made into what the runtime
trains (train.Training): an Estimator with the flags' RunConfig, as a user's script would
build it, its TrainSpec and EvalSpec, and an exporter for its serving_input_receiver_fn."""

from __future__ import annotations

import tensorflow as tf

from tfconfig_slurm.backends.estimator import sync
from tfconfig_slurm.backends.estimator.train import Training
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.task.lifecycle import TrainingSettings
from tfconfig_slurm.process.user_code.experiment import Experiment


def training(
    experiment: Experiment, settings: TrainingSettings, role: ClusterRole | None
) -> Training:
    model_fn = experiment.model_fn
    if settings.sync_replicas and role is not None:
        model_fn = sync.synchronous_model_fn(model_fn, role.trainers, role.trainer_id == 0)
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
    return tf.estimator.RunConfig(
        model_dir=str(settings.model_dir),
        **interval,
        keep_checkpoint_max=settings.keep_checkpoint_max,
        session_config=_session_config(settings),
        log_step_count_steps=settings.log_every_steps,
        save_summary_steps=settings.log_every_steps,
    )


def _session_config(settings: TrainingSettings) -> tf.compat.v1.ConfigProto:
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=settings.intra_op_threads,
        inter_op_parallelism_threads=settings.inter_op_threads,
        allow_soft_placement=True,
    )
    config.gpu_options.allow_growth = settings.gpu_memory_growth
    if settings.gpu_memory_fraction is not None:
        config.gpu_options.per_process_gpu_memory_fraction = settings.gpu_memory_fraction
    return config

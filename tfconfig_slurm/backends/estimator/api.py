"""`tfconfig_slurm.train_and_evaluate`: tf.estimator.train_and_evaluate for a user's own
script under a plain `srun python my_script.py`, run through the lifecycle the CLI's tasks run
(process/task/lifecycle.py)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path
from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context

from tfconfig_slurm.backends.estimator import train, trainer
from tfconfig_slurm.cluster import LayoutPolicy
from tfconfig_slurm.cluster.step import read_slurm_job
from tfconfig_slurm.errors import TfconfigSlurmError, UsageError
from tfconfig_slurm.process import console, exits
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import claim, history
from tfconfig_slurm.process.supervision import local_cluster
from tfconfig_slurm.process.task import hang_watch, lifecycle, place

LOCAL_CLUSTER = "TFCONFIG_SLURM_LOCAL_CLUSTER"
_NAMING = claim.Naming(
    "RunConfig(model_dir=...)",
    "tf.estimator.RunConfig(model_dir='/scratch/me/runs/lr-0.01')",
    "RunConfig(model_dir=...)",
    "give this run a model_dir of its own",
)
# As python -m tfconfig_slurm.run's defaults.
_STOP_POLICY = preemption.StopPolicy(
    requeue_on={signal.SIGUSR1.name},
    max_requeues=3,
    time_limit_signal=signal.SIGUSR1.name,
    time_limit_margin=120.0,
)


def train_and_evaluate(
    estimator: tf.estimator.Estimator,
    train_spec: tf.estimator.TrainSpec,
    eval_spec: tf.estimator.EvalSpec,
    *,
    layout: LayoutPolicy | None = None,
) -> tuple[dict[str, Any] | None, list[Any]] | None:
    """tf.estimator.train_and_evaluate, as this task of wherever it runs:
      - with a TF_CONFIG made for this task (launch/with-tfconfig, a local cluster): that task;
      - in a SLURM job step of several tasks: its role in tfconfig-slurm's layout, with the
        TFCONFIG_SLURM_PS_PER_NODE, _ROLES, _EVALUATOR, _ADDRESS_TEMPLATE and _PORT_BASE
        variables as the layout flags (or `layout`);
      - with TFCONFIG_SLURM_LOCAL_CLUSTER=ps=1,workers=1: a cluster of this script's
        processes on this machine (this process waits for them, then exits with their status);
      - otherwise in this process.
    RunConfig settings are kept where the cluster does not decide them; `train_spec.max_steps`
    must be set; summary.json goes to the model directory. Parameter servers never return.
    SIGUSR1 stops every trainer at the next step with a checkpoint and requeues the SLURM job;
    SIGTERM stops without requeueing.

    Returns (metrics, export results) on the chief and in a single process, None on a worker
    and the evaluator. Bad input ends the process with one line naming the setting, exit 2.
    """
    console.start_logging()
    program = console.script_name()
    try:
        return _run(estimator, train_spec, eval_spec, layout, program)
    except TfconfigSlurmError as error:
        console.fail(program, error.one_line())


def _run(
    estimator: tf.estimator.Estimator,
    train_spec: tf.estimator.TrainSpec,
    eval_spec: tf.estimator.EvalSpec,
    layout: LayoutPolicy | None,
    program: str,
) -> tuple[dict[str, Any] | None, list[Any]] | None:
    stop = preemption.StopRequest()
    stop.listen(signal.SIGUSR1, signal.SIGTERM)
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    _check_arguments(estimator, train_spec, eval_spec, layout)
    directory = Path(estimator.model_dir)
    history.check_writable(directory, _NAMING)
    # SLURM's job, read here once for the task's whole life (its step: place.find).
    job = read_slurm_job(os.environ)
    counts = os.environ.pop(LOCAL_CLUSTER, "")
    if counts:
        # Python 3.10 keeps the command line exactly as it was given (python -m ... too).
        command = getattr(sys, "orig_argv", [sys.executable, *sys.argv])
        status = local_cluster.run(
            local_cluster.parse(counts, LOCAL_CLUSTER),
            directory,
            command,
            program=program,
            naming=_NAMING,
            environ=os.environ,
            job=job,
        )
        exits.end_now(status, "the local cluster ended")
    where = _place(layout)
    name = Path(sys.argv[0]).stem or directory.name
    training = trainer.Training(
        estimator, train_spec, eval_spec, name=name, hparams=estimator.params
    )
    task = lifecycle.TaskRun(
        place=where,
        job=job,
        environ=os.environ,
        model_dir=directory,
        naming=_NAMING,
        stop=stop,
        stop_policy=_STOP_POLICY,
        hang_seconds=hang_watch.seconds_from(None, os.environ),
    )
    result: trainer.Result | None = lifecycle.run(
        task,
        lifecycle.ESTIMATOR,
        lambda: train.EstimatorBackend(training, where.role, stop),
    )
    return result


def _check_arguments(
    estimator: Any, train_spec: Any, eval_spec: Any, layout: LayoutPolicy | None
) -> None:
    """train_and_evaluate's arguments of the types it takes, and max_steps set."""
    for name, value, expected, public, example in (
        (
            "estimator", estimator, tf.estimator.Estimator, "Estimator",
            "tf.estimator.DNNClassifier(...)",
        ),
        (
            "train_spec", train_spec, tf.estimator.TrainSpec, "TrainSpec",
            "tf.estimator.TrainSpec(input_fn, max_steps=10000)",
        ),
        (
            "eval_spec", eval_spec, tf.estimator.EvalSpec, "EvalSpec",
            "tf.estimator.EvalSpec(input_fn)",
        ),
    ):  # fmt: skip
        if not isinstance(value, expected):
            raise UsageError(
                name,
                f"is {console.a_or_an(type(value).__name__)}, not a tf.estimator.{public}",
                f"train_and_evaluate(estimator, train_spec, eval_spec), e.g. {example}",
            )
    if layout is not None and not isinstance(layout, LayoutPolicy):
        raise UsageError(
            "layout",
            f"is {console.a_or_an(type(layout).__name__)}, not a tfconfig_slurm.LayoutPolicy",
            "e.g. layout=tfconfig_slurm.LayoutPolicy(ps_per_node=2), or leave it out",
        )
    if train_spec.max_steps is None:
        raise UsageError(
            "train_spec.max_steps",
            "is not set; the cluster's tasks need to know the final step",
            "e.g. tf.estimator.TrainSpec(input_fn, max_steps=10000)",
        )


def _place(layout: LayoutPolicy | None) -> place.Place:
    """This task's place, by `layout` or the layout variables, set in the environment."""
    policy = layout or place.policy_from_environ(os.environ)
    try:
        where = place.find(
            os.environ,
            policy,
            "layout" if layout else place.POLICY_VARIABLES[place.servers_flag(policy)],
        )
    except TfconfigSlurmError as error:
        raise error if layout else place.in_variables(error) from None
    where.set_in(os.environ)
    if (
        where.role is not None
        and where.layout_source != "TF_CONFIG"
        and context.context()._initialized
    ):
        # CUDA reads CUDA_VISIBLE_DEVICES once, as TensorFlow first finds its devices.
        logging.warning(
            "CUDA_VISIBLE_DEVICES: set to [%s] for this task after TensorFlow had found "
            "its devices, so the task may take every GPU of its node. HINT: call "
            "tfconfig_slurm.train_and_evaluate before the script runs any TensorFlow op, "
            "or start it with launch/with-tfconfig",
            where.gpus,
        )
    return where

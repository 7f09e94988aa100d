"""Train an experiment (Estimator or Keras); run again with the same id to resume.

  python -m tfconfig_slurm.run --experiment mnist_deep     # Estimator, TensorFlow 2.15
  python -m tfconfig_slurm.run --experiment mnist_keras    # tf-keras, TensorFlow 2.16+
  python -m tfconfig_slurm.run --experiment mnist_keras3   # Keras 3 on JAX (.venv-keras3)
  python -m tfconfig_slurm.run --experiment path/to/my_model.py --train_steps=5000 \\
      --hparams=learning_rate=0.0005 --output_root=/scratch/$USER/runs --experiment_id=lr5e-4

An Estimator experiment is a module defining model_fn(features, labels, mode, params) and
input_fn(mode, params) (or train_input_fn and eval_input_fn), and optionally
serving_input_receiver_fn; a Keras experiment defines build_model(params), returning the
compiled model, and dataset(mode, params), the batches for mode "train" or "eval"; either
may define HPARAMS. Checkpoints, TensorBoard events, summary.json (and an Estimator's
exported model) go to <output_root>/<experiment_id>; a run that finds a checkpoint there
resumes from it. A Keras experiment trains all-reduce (MultiWorkerMirroredStrategy), or
with --coordinator with parameter servers (ParameterServerStrategy); one that imports keras
and not tf_keras is a Keras 3 one, and trains data-parallel on JAX, one process a task.

Where it runs decides how it trains:
  - with TF_CONFIG set (by launch/with-tfconfig or --local_cluster): that task of the cluster;
  - in a SLURM job step of several tasks: the task's role in the layout tfconfig-slurm
    computes (the layout flags below; see tfconfig-slurm --explain);
  - otherwise: in this one process. --local_cluster=ps=1,workers=2 (a Keras experiment:
    workers=1, or with --coordinator ps=1,workers=1) starts a cluster of processes on this
    machine instead.
Parameter servers exit once every trainer has finished.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from absl import flags, logging

from tfconfig_slurm.cluster import LayoutPolicy
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, TRAINERS
from tfconfig_slurm.cluster.step import SlurmJob, read_slurm_job
from tfconfig_slurm.commands import (
    layout_flags,
    max_restarts_flag,
    run_directory,
    runtime_backends,
    runtime_flags,
)
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import held_signals
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import attempts, claim, failure, history
from tfconfig_slurm.process.supervision import local_cluster, supervise
from tfconfig_slurm.process.task import hang_watch, lifecycle, place
from tfconfig_slurm.process.user_code import experiment as experiment_lib

PROGRAM = "tfconfig-slurm-run"

# Set for the coordinator's child process to its step's run id: the supervisor of the chief
# of a --coordinator step runs the same command again as its child, which coordinates.
_COORDINATING = "TFCONFIG_SLURM_COORDINATING"


flags.adopt_module_key_flags(runtime_flags)


def main(argv: Sequence[str]) -> int | None:
    # First of all: SIGUSR1's and SIGTERM's default action ends the process.
    stop = preemption.StopRequest()
    preempt = preemption.parse_signal(runtime_flags.PREEMPT_SIGNAL.value)
    stop.listen(preempt, signal.SIGTERM)
    for came in held_signals.release({preempt, signal.SIGTERM}):
        stop.ask(came.name)
    # A hang is debuggable: SIGQUIT writes every thread's stack, and nothing else happens.
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    requeue_on = {preempt.name} if preempt else set()
    if runtime_flags.REQUEUE_ON_SIGTERM.value:
        requeue_on.add(signal.SIGTERM.name)
    stop_policy = preemption.StopPolicy(
        requeue_on,
        runtime_flags.MAX_REQUEUES.value,
        time_limit_signal=preempt.name if preempt else None,
        time_limit_margin=runtime_flags.TIME_LIMIT_MARGIN.value,
    )
    spec = _checked_experiment()
    # Checked before TensorFlow is imported, so that bad input fails at once.
    name, _ = experiment_lib.locate(spec)
    kind = experiment_lib.require_runtime(spec)
    # SLURM's job, read here once for the task's whole life (its step: place.find).
    job = read_slurm_job(os.environ)
    directory, hparams = run_directory.chosen(name, job)
    with attempts.recording_refusal(directory, job):
        return _start(spec, kind, job, hparams, directory, stop=stop, stop_policy=stop_policy)


def _start(
    spec: str,
    kind: str,
    job: SlurmJob | None,
    hparams: str,
    directory: Path,
    *,
    stop: preemption.StopRequest,
    stop_policy: preemption.StopPolicy,
) -> int | None:
    """The task's layout and place checked, then its run (or a local cluster's, or the model
    directory printed for a batch script)."""
    policy = _policy_for(kind)
    counts = _local_cluster(kind, policy)
    _check_literal_hparams(spec, hparams)
    # Read now, so that a batch script's first call refuses a value every task would.
    hang_seconds = hang_watch.seconds_from(runtime_flags.HANG_TIMEOUT.value, os.environ)
    named = run_directory.naming()
    history.check_writable(directory, named)
    if runtime_flags.PRINT_MAX_RESTARTS.value:
        if runtime_flags.PRINT_MODEL_DIR.value:
            raise UsageError(
                "--print_max_restarts",
                "comes with --print_model_dir: a batch script reads one answer at a time, and "
                "took this one for the model directory",
                "leave both out of a batch script's flags: launch/train.sbatch asks for each "
                "itself",
            )
        sys.stdout.write(f"{max_restarts_flag.MAX_RESTARTS.value}\n")
        return 0
    if runtime_flags.PRINT_MODEL_DIR.value or counts is not None:
        # A directory every task would refuse stops a batch script, or a local cluster's
        # launcher, here, in one line, before any task starts.
        claim.check(directory, claim.this_holder(job), named)
        runtime_backends.check_trainable([directory], spec, kind, policy.coordinator, named)
    if runtime_flags.PRINT_MODEL_DIR.value:
        # The directory alone on stdout, which a batch script reads; for its user, on stderr,
        # what training there would do.
        sys.stdout.write(f"{directory}\n")
        sys.stderr.write(f"{history.before_start(directory, runtime_flags.TRAIN_STEPS.value)}\n")
        return 0
    if counts is not None:
        return _launched(counts, directory, named, job, policy=policy, stop=stop)
    return _train(
        kind,
        hparams,
        policy,
        lifecycle.TaskRun(
            place=place.find(os.environ, policy, place.servers_flag(policy)),
            model_dir=directory,
            naming=named,
            stop=stop,
            stop_policy=stop_policy,
            environ=os.environ,
            job=job,
            hang_seconds=hang_seconds,
        ),
    )


def _launched(
    counts: dict[str, int],
    directory: Path,
    named: claim.Naming,
    job: SlurmJob | None,
    *,
    policy: LayoutPolicy,
    stop: preemption.StopRequest,
) -> int:
    """A local cluster of this command, launched and run to its end; its exit status."""
    if stop.signum is not None:
        return _stopped_before_start(stop)
    # The trailing --local_cluster= overrides the launcher's: a task runs one role.
    command = [sys.executable, "-m", "tfconfig_slurm.run", *sys.argv[1:], "--local_cluster="]
    return local_cluster.run(
        counts, directory, command, program=PROGRAM, naming=named, environ=os.environ,
        job=job, coordinator=policy.coordinator,
    )  # fmt: skip


def _check_literal_hparams(spec: str, hparams: str) -> None:
    """--hparams checked against the experiment's HPARAMS where its source gives them
    literally; else the tasks check them, as importing the module imports TensorFlow. After
    the flags' own checks, so that a batch script stops at its first call on flags that every
    task would refuse (and a local cluster's launcher before it starts any)."""
    literal = experiment_lib.literal_hparams(spec)
    if literal is not None:
        experiment_lib.with_overrides(literal, hparams)


def _local_cluster(kind: str, policy: LayoutPolicy) -> dict[str, int] | None:
    """The tasks --local_cluster asks for, for an experiment of `kind`; None without it."""
    if not runtime_flags.LOCAL_CLUSTER.value:
        return None
    keras = kind in (experiment_lib.KERAS, experiment_lib.KERAS3)
    return local_cluster.parse(
        runtime_flags.LOCAL_CLUSTER.value,
        all_reduce=keras and not policy.coordinator,
        coordinator=policy.coordinator,
    )


def _policy_for(kind: str) -> LayoutPolicy:
    """The step's layout policy, as the flags give it, checked for an experiment of `kind`."""
    policy = layout_flags.step_policy()
    if policy.coordinator and kind == experiment_lib.KERAS3:
        raise UsageError(
            "--coordinator",
            "lays the step out for ParameterServerStrategy, which trains tf-keras models, and "
            "a Keras 3 experiment trains on JAX, one process a task, all of them training",
            "leave --coordinator out (docs/keras3.md)",
        )
    if policy.coordinator and kind != experiment_lib.KERAS:
        raise lifecycle.coordinator_refused("--coordinator")
    runtime_backends.check_inter_op_threads(policy.coordinator)
    if runtime_flags.STEPS_PER_EXECUTION.value is not None and kind != experiment_lib.KERAS3:
        raise UsageError(
            "--steps_per_execution",
            "applies to a Keras 3 experiment only",
            "leave it out; a tf-keras experiment can pass steps_per_execution to its own "
            "model.compile",
        )
    if kind in (experiment_lib.KERAS, experiment_lib.KERAS3):
        return _keras_layout(policy, kind)
    return policy


def _train(kind: str, hparams: str, policy: LayoutPolicy, task: lifecycle.TaskRun) -> int | None:
    """This task of the step trains (or serves), at its place; a process that ends it."""
    # Python's KeyboardInterrupt waits for TensorFlow's C++ to return, which a task waiting
    # for its peers does not.
    task.stop.listen(signal.SIGINT)
    task.place.set_in(os.environ)
    # Cluster-only flags in a process that trains alone: layout flags are only warned of (one
    # --flagfile may serve a job's steps and a workstation), --sync_replicas refused.
    layout = [f"--{name}" for name in layout_flags.LAYOUT_FLAGS if flags.FLAGS[name].present]
    if task.place.role is None and layout:
        logging.warning(
            "%s: lay out the tasks of a SLURM step, and this trains in one process, so they "
            "change nothing here (--local_cluster=ps=1,workers=2 runs a cluster on this machine)",
            ", ".join(layout),
        )
    if task.place.role is None and runtime_flags.SYNC_REPLICAS.value:
        raise UsageError(
            "--sync_replicas",
            "synchronises the trainers of a cluster, and this trains in one process",
            "add --local_cluster=ps=1,workers=1, or run it in a SLURM step of several tasks",
        )
    if policy.coordinator:
        return _coordinated(task, hparams)
    backend = runtime_backends.for_kind(kind, os.environ)
    lifecycle.run_to_exit(
        task, runtime_backends.kind_of(kind, False), partial(backend, task, hparams)
    )


def _checked_experiment() -> str:
    """--experiment, once the flags that no run can take, whatever it trains, are refused."""
    if runtime_flags.EXPERIMENT.value is None:
        raise UsageError("--experiment", "is required", f"e.g. {PROGRAM} --experiment mnist_deep")
    if runtime_flags.SAVE_CHECKPOINTS_STEPS.present and runtime_flags.SAVE_CHECKPOINTS_SECS.present:
        raise UsageError(
            "--save_checkpoints_steps",
            "and --save_checkpoints_secs exclude each other",
            "choose one",
        )
    # Here, not as the flag's upper bound: absl would then say of a 0 that it is not in
    # [1, 9223372036854775807].
    if runtime_flags.TRAIN_STEPS.value >= 2**63:
        raise UsageError(
            "--train_steps",
            f"is {runtime_flags.TRAIN_STEPS.value}, past the largest global step, 2**63 - 1",
            "train for fewer steps",
        )
    if runtime_flags.DATA_DIR.value is not None and not Path(runtime_flags.DATA_DIR.value).is_dir():
        # A typo would otherwise train on an experiment's fallback data, and succeed.
        raise UsageError(
            "--data_dir",
            f"{runtime_flags.DATA_DIR.value!r} is not a directory",
            "give the directory that holds the data, or leave --data_dir out",
        )
    return runtime_flags.EXPERIMENT.value


def _coordinated(task: lifecycle.TaskRun, hparams: str) -> int:
    """A task of a --coordinator step, run as with-tfconfig runs a coordinator's script: each
    task supervises a child, which for a ps or a worker serves (backends/keras/serve.py), and
    for the chief and the evaluator is this command again, as the lifecycle's backend."""
    role = task.place.role
    if role is None:
        raise UsageError(
            "--coordinator",
            "lays out a step of several tasks (a coordinator, parameter servers and workers), "
            "and this process trains alone",
            "run it in every task of a SLURM step, e.g. srun --nodes=2 --ntasks-per-node=2, or "
            "on this machine with --local_cluster=ps=1,workers=1",
        )
    # The step's run id, so that a marker a shell passed on from another step is no marker.
    marker = role.run_id or "a TF_CONFIG given"
    again = role.role in (CHIEF, EVALUATOR)
    if again and os.environ.get(_COORDINATING) == marker:
        lifecycle.run_to_exit(
            task,
            lifecycle.TF_KERAS_COORDINATOR,
            partial(runtime_backends.coordinator, task, hparams),
        )
    threads, said = runtime_backends.task_threads(task.place)
    if said and not again:
        logging.info("%s", said)
    command = (
        [sys.executable, "-m", "tfconfig_slurm.run", *sys.argv[1:]]
        if again
        else [sys.executable, "-m", "tfconfig_slurm.backends.keras.serve", *map(str, threads)]
    )
    # Every task of the strategy's cluster fails a call to a lost peer at once, rather than
    # waiting for it (TensorFlow's tutorial).
    environ = {**os.environ, "GRPC_FAIL_FAST": "use_caller", _COORDINATING: marker}
    failure.attach(task.model_dir, role, task.place.node)
    if task.stop.signum is not None:
        return _stopped_before_start(task.stop)
    group = supervise.command_group()
    group.start(command, environ)
    return supervise.supervise(group, role, None, supervise.WORKER_RESTARTS)


def _stopped_before_start(stop: preemption.StopRequest) -> int:
    """The status of a launcher or supervisor told to stop (a signal held as it started) before
    it started anything, which would not have heard of it: that signal's, as a shell says it."""
    assert stop.signum is not None
    logging.warning("%s: told to stop before any task started; none is", stop.signal_name)
    return 128 + stop.signum


def _keras_layout(policy: LayoutPolicy, kind: str) -> LayoutPolicy:
    """A Keras experiment's layout (all-reduce, or --coordinator's), the flags it cannot
    honour refused."""
    on_jax = kind == experiment_lib.KERAS3
    intra_op, inter_op = runtime_flags.INTRA_OP_THREADS.value, runtime_flags.INTER_OP_THREADS.value
    threads = "--intra_op_threads" if intra_op else "--inter_op_threads"
    refused = {
        threads: (
            on_jax and bool(intra_op or inter_op),
            "it sizes TensorFlow's thread pools, and a Keras 3 experiment trains on JAX",
        ),
        "--evaluator": (
            layout_flags.EVALUATOR.value and not policy.coordinator,
            "every trainer of an all-reduce run evaluates the final model (with --coordinator, "
            "an evaluator evaluates each checkpoint)",
        ),
        "--sync_replicas": (
            runtime_flags.SYNC_REPLICAS.value,
            "ParameterServerStrategy's workers update the variables asynchronously, and cannot "
            "be made to wait for each other"
            if policy.coordinator
            else "all-reduce training is synchronous already",
        ),
        "--gpu_memory_growth": (
            runtime_flags.GPU_MEMORY_GROWTH.value,
            "the Keras runtime does not set it yet",
        ),
        "--gpu_memory_fraction": (
            runtime_flags.GPU_MEMORY_FRACTION.value is not None,
            "the Keras runtime does not set it yet",
        ),
    }
    for flag, (given, why) in refused.items():
        if given:
            raise UsageError(
                flag, f"does not apply to a Keras experiment: {why}", f"leave {flag} out"
            )
    if policy.coordinator:
        return policy
    roles = set(policy.roles or ())
    culprit = (
        "--ps_per_node" if policy.ps_per_node else "--roles" if roles - set(TRAINERS) else None
    )
    if culprit:
        raise UsageError(
            culprit,
            "asks for parameter servers or an evaluator, and a Keras experiment trains "
            "all-reduce, with a chief and workers only",
            "leave it out: a Keras experiment's step is laid out as --all_reduce; a tf-keras "
            "one trains with parameter servers under --coordinator (ParameterServerStrategy)",
        )
    return dataclasses.replace(policy, all_reduce=True)


def run() -> None:
    run_cli(
        PROGRAM,
        main,
        logs=True,
        tensorflow_log_level="1",
        read_by_scripts=(runtime_flags.PRINT_MODEL_DIR, runtime_flags.PRINT_MAX_RESTARTS),
    )


if __name__ == "__main__":
    run()

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
from typing import Callable, TypeVar

from absl import flags, logging

from tfconfig_slurm.cluster import LayoutPolicy
from tfconfig_slurm.cluster import threads as threads_lib
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, TRAINERS
from tfconfig_slurm.cluster.role import input_shard
from tfconfig_slurm.cluster.step import SlurmJob, read_slurm_job
from tfconfig_slurm.cluster.threads import Threads
from tfconfig_slurm.commands import layout_flags, max_restarts_flag
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import (
    claim,
    console,
    failure,
    history,
    lifecycle,
    local_cluster,
    model_dir,
    native_noise,
    place,
    preemption,
    refusal,
    run_dir,
    supervise,
)
from tfconfig_slurm.process import experiment as experiment_lib
from tfconfig_slurm.process import hparams as hparams_lib
from tfconfig_slurm.process.settings import TrainingSettings

PROGRAM = "tfconfig-slurm-run"

EXPERIMENT = flags.DEFINE_string(
    "experiment",
    None,
    "The experiment: a name (NAME.py in ./experiments, else one that ships with the "
    "package: mnist_deep, mnist_keras, mnist_keras3), a file path, or a module path.",
)
# Their defaults come from the environment when the command runs (output_root,
# experiment_id), not when this module is imported.
OUTPUT_ROOT = flags.DEFINE_string(
    "output_root",
    None,
    "Where model directories go (default: $TFCONFIG_SLURM_OUTPUT, else ./tf-output).",
)
EXPERIMENT_ID = flags.DEFINE_string(
    "experiment_id",
    None,
    "The model directory's name under --output_root; the same id resumes, and only one run "
    "at a time may train there (default: $EXPERIMENT_ID, else the experiment's name, and in "
    "a SLURM job array <name>-<array task id>; a sweep's run is <sweep>-<line>).",
)
ID_VARIABLE = "EXPERIMENT_ID"
# Set for the coordinator's child process to its step's run id: the supervisor of the chief
# of a --coordinator step runs the same command again as its child, which coordinates.
_COORDINATING = "TFCONFIG_SLURM_COORDINATING"


def output_root() -> str:
    """--output_root, else $TFCONFIG_SLURM_OUTPUT, else ./tf-output."""
    return OUTPUT_ROOT.value or run_dir.output_root(os.environ)


def naming() -> claim.Naming:
    """How this command's user named the model directory, for the errors about it: the
    output root by --output_root, or by the variable where that chose it."""
    if OUTPUT_ROOT.value or not os.environ.get(run_dir.OUTPUT_ROOT_VARIABLE):
        return claim.CLI_NAMING
    return claim.CLI_NAMING._replace(
        root=run_dir.OUTPUT_ROOT_VARIABLE,
        root_example=f"{run_dir.OUTPUT_ROOT_VARIABLE}=/scratch/$USER/tf-output",
    )


PRINT_MODEL_DIR = flags.DEFINE_boolean(
    "print_model_dir",
    False,
    "Print the model directory these flags train in, and exit (for batch scripts); on "
    "stderr, what training there would do: start a new run, resume one at its step, or find "
    "it trained already.",
)
PRINT_MAX_RESTARTS = flags.DEFINE_boolean(
    "print_max_restarts",
    False,
    "Print --max_restarts and exit (for batch scripts: launch/train.sbatch).",
)
TRAIN_STEPS = flags.DEFINE_integer(
    "train_steps", 1000, "Train until the global step reaches this.", lower_bound=1
)

EVAL_STEPS = flags.DEFINE_integer(
    "eval_steps", None, "Batches per evaluation (default: the whole eval set).", lower_bound=1
)
BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 64, "Examples per step and trainer; params['batch_size'].", lower_bound=1
)
HPARAMS = flags.DEFINE_string(
    "hparams", "", "Overrides of the experiment's HPARAMS: name=value,name=value."
)
SWEEP_FILE = flags.DEFINE_string(
    "sweep_file",
    None,
    "In a SLURM job array: train line <array task id> of this file (one --hparams value a "
    "line, after --hparams; blank lines and # comments skipped) under the experiment id "
    "<file name without suffix>-<array task id>. launch/sweep sets it.",
)
DATA_DIR = flags.DEFINE_string(
    "data_dir",
    None,
    "The directory the experiment reads its data from (mnist_deep: the MNIST IDX files; "
    "without them, or without this flag, the digits that ship with tfconfig-slurm).",
)
SAVE_CHECKPOINTS_STEPS = flags.DEFINE_integer(
    "save_checkpoints_steps",
    None,
    "Checkpoint every N global steps (a Keras experiment's default: 1000; an Estimator "
    "experiment checkpoints by --save_checkpoints_secs unless this is set).",
    lower_bound=1,
)
SAVE_CHECKPOINTS_SECS = flags.DEFINE_integer(
    "save_checkpoints_secs",
    None,
    "Checkpoint every N seconds (Estimator's default: 600 when neither is set).",
    lower_bound=1,
)
KEEP_CHECKPOINT_MAX = flags.DEFINE_integer(
    "keep_checkpoint_max", 5, "Checkpoints kept in the model directory.", lower_bound=1
)
INTRA_OP_THREADS = flags.DEFINE_integer(
    "intra_op_threads",
    None,
    "Threads inside one op. Default, in a cluster: sized by the task's role and its node's "
    "share of the CPUs it may run on (tfconfig-slurm --explain shows each task's); in one "
    "process, and with 0: TensorFlow picks (every CPU).",
    lower_bound=0,
)
INTER_OP_THREADS = flags.DEFINE_integer(
    "inter_op_threads",
    None,
    "Ops run at once; default as --intra_op_threads. With 1, a trainer in a cluster sends its "
    "gradients to the ps only once its whole backward pass is done; 2 lets them overlap.",
    lower_bound=0,
)
LOG_EVERY_STEPS = flags.DEFINE_integer(
    "log_every_steps",
    100,
    "Log the loss, examples/s and global steps/s, and write scalars, each time the global "
    "step passes a multiple of N: each trainer as it sees the global step (with parameter "
    "servers, a trainer that shares the steps may see 102 pass 100, and see none pass the "
    "last multiple, which another trainer took).",
    lower_bound=1,
)
GPU_MEMORY_GROWTH = flags.DEFINE_boolean(
    "gpu_memory_growth", False, "Take GPU memory as needed instead of all at start."
)
SYNC_REPLICAS = flags.DEFINE_boolean(
    "sync_replicas",
    False,
    "In a cluster, update synchronously: every step aggregates one gradient from each trainer "
    "(SyncReplicasOptimizer around the experiment's optimizer).",
)
LOCAL_CLUSTER = flags.DEFINE_string(
    "local_cluster",
    None,
    "Start a cluster of processes on this machine instead of training in one: "
    "ps=N,workers=N[,evaluator=1] (plus the chief); for a Keras experiment workers=N, or with "
    "--coordinator ps=N,workers=N[,evaluator=1]. One log per task in <model dir>/logs.",
)
GPU_MEMORY_FRACTION = flags.DEFINE_float(
    "gpu_memory_fraction",
    None,
    "Share of each GPU's memory a process may take.",
    lower_bound=0.0,
    upper_bound=1.0,
)

PREEMPT_SIGNAL = flags.DEFINE_string(
    "preempt_signal",
    "USR1",
    "The signal that stops training at the next step with a checkpoint and requeues the "
    "SLURM job, as #SBATCH --signal=USR1@90 sends it before a time limit or preemption; '' "
    "to leave it alone. (SIGQUIT is taken: it writes every thread's Python stack to the "
    "task's log, e.g. scancel --signal=QUIT JOBID, and the task runs on.)",
)
REQUEUE_ON_SIGTERM = flags.DEFINE_boolean(
    "requeue_on_sigterm",
    False,
    "SIGTERM (a time limit or scancel without --signal's warning, a preemption) always stops "
    "training at the next step with a checkpoint, within SLURM's 30 s KillWait; with this, "
    "the job is also requeued. Off: SLURM requeues preempted jobs itself where its "
    "PreemptMode says so, and a scancel means stop.",
)
TIME_LIMIT_MARGIN = flags.DEFINE_float(
    "time_limit_margin",
    120.0,
    "Seconds before the job's time limit (asked of squeue, and again each minute, as "
    "scontrol update TimeLimit= moves it) at which every task is sent --preempt_signal: "
    "training stops with a checkpoint and the job requeues itself, with no #SBATCH --signal "
    "needed. At most half the time the job has left when the run starts; at least twice the "
    "chief's longest checkpoint write. 0: stop only on signals.",
    lower_bound=0.0,
)
MAX_REQUEUES = flags.DEFINE_integer(
    "max_requeues",
    3,
    "Requeue the job on --preempt_signal only while it was requeued (SLURM_RESTART_COUNT) or "
    "went on in a new job (where requeue is refused) fewer times than this.",
    lower_bound=0,
)

flags.adopt_module_key_flags(layout_flags)
flags.adopt_module_key_flags(max_restarts_flag)


def main(argv: Sequence[str]) -> int | None:
    # First of all: the default action of SIGUSR1 and SIGTERM ends the process, and they may
    # come at any time.
    stop = preemption.StopRequest()
    preempt = preemption.parse_signal(PREEMPT_SIGNAL.value)
    stop.listen(preempt, signal.SIGTERM)
    # A hang is debuggable: SIGQUIT writes every thread's stack, and nothing else happens.
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    requeue_on = {preempt.name} if preempt else set()
    if REQUEUE_ON_SIGTERM.value:
        requeue_on.add(signal.SIGTERM.name)
    spec = _checked_experiment()
    # Checked before TensorFlow is imported, so that bad input fails at once.
    name, _ = experiment_lib.locate(spec)
    kind = experiment_lib.require_runtime(spec)
    # SLURM's job, read here once for the task's whole life (its step: place.find).
    job = read_slurm_job(os.environ)
    hparams, default_id = HPARAMS.value, _default_id(name, job)
    if SWEEP_FILE.value:
        hparams, default_id = _sweep_run(Path(SWEEP_FILE.value), job)
    directory = Path(output_root(), _experiment_id(default_id, swept=bool(SWEEP_FILE.value)))
    with refusal.recording(directory, job):
        return _start(
            spec,
            kind,
            job=job,
            hparams=hparams,
            directory=directory,
            stop=stop,
            preempt=preempt,
            requeue_on=requeue_on,
        )


def _start(
    spec: str,
    kind: str,
    *,
    job: SlurmJob | None,
    hparams: str,
    directory: Path,
    stop: preemption.StopRequest,
    preempt: signal.Signals | None,
    requeue_on: set[str],
) -> int | None:
    """The task's layout and place checked, then its run (or a local cluster's, or the model
    directory printed for a batch script); a refusal of its input is recorded for the runs
    table where it comes before the run starts (process/refusal.py)."""
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
    is_keras = kind in (experiment_lib.KERAS, experiment_lib.KERAS3)
    if is_keras:
        policy = _keras_layout(policy, kind)
    counts = (
        local_cluster.parse(
            LOCAL_CLUSTER.value,
            all_reduce=is_keras and not policy.coordinator,
            coordinator=policy.coordinator,
        )
        if LOCAL_CLUSTER.value
        else None
    )
    # After the flags' own checks, so that a batch script stops at its first call on flags
    # that every task would refuse (and a local cluster's launcher before it starts any). An
    # experiment's hparams are checked here where its source gives them literally; else the
    # tasks check them, as importing the module imports TensorFlow.
    literal = experiment_lib.literal_hparams(spec)
    if literal is not None:
        hparams_lib.with_overrides(literal, hparams)
    named = naming()
    model_dir.check_writable(directory, named)
    if PRINT_MAX_RESTARTS.value:
        sys.stdout.write(f"{max_restarts_flag.MAX_RESTARTS.value}\n")
        return 0
    if PRINT_MODEL_DIR.value or counts is not None:
        # A directory every task would refuse (another live run holds it, or another backend
        # or experiment trained it) stops a batch script, or a local cluster's launcher, here,
        # in one line, before any task starts.
        model_dir.check_free(directory, None, named, job)
        history.check_resumable(
            directory, _backend_kind(kind, policy.coordinator).checkpoints, named
        )
        history.check_same_experiment(directory, experiment_lib.locate(spec)[0], named)
    if PRINT_MODEL_DIR.value:
        sys.stdout.write(f"{directory}\n")
        # On stderr, which a batch script's .out holds: which run a job is about to carry on.
        sys.stderr.write(f"{history.before_start(directory, TRAIN_STEPS.value)}\n")
        return 0
    if counts is not None:
        # The trailing --local_cluster= overrides the launcher's: a task runs one role.
        command = [sys.executable, "-m", "tfconfig_slurm.run", *sys.argv[1:], "--local_cluster="]
        return local_cluster.run(
            counts,
            directory,
            command,
            program=PROGRAM,
            naming=named,
            environ=os.environ,
            job=job,
            coordinator=policy.coordinator,
        )
    # A task's Ctrl-C (a local cluster's launcher passes SIGTERM on instead): Python's own
    # KeyboardInterrupt waits for TensorFlow's C++ to return, which a task waiting for its
    # peers does not.
    stop.listen(signal.SIGINT)
    where = place.find(os.environ, policy, place.servers_flag(policy))
    if where.role is None:
        _check_one_process()
    task = lifecycle.TaskRun(
        place=where,
        model_dir=directory,
        naming=named,
        stop=stop,
        stop_policy=preemption.StopPolicy(
            requeue_on,
            MAX_REQUEUES.value,
            time_limit_signal=preempt.name if preempt else None,
            time_limit_margin=TIME_LIMIT_MARGIN.value,
        ),
        environ=os.environ,
        job=job,
    )
    if policy.coordinator:
        return _coordinated(task, hparams)
    backend = {experiment_lib.KERAS: _keras, experiment_lib.KERAS3: _keras3}.get(kind, _estimator)
    lifecycle.run_to_exit(task, _backend_kind(kind, False), partial(backend, task, hparams))


def _backend_kind(kind: str, coordinator: bool) -> lifecycle.BackendKind:
    """How the backend of an experiment of `kind` trains, and whose checkpoints it resumes."""
    if coordinator:
        return lifecycle.TF_KERAS_COORDINATOR
    kinds = {experiment_lib.KERAS: lifecycle.TF_KERAS, experiment_lib.KERAS3: lifecycle.KERAS_3}
    return kinds.get(kind, lifecycle.ESTIMATOR)


def _checked_experiment() -> str:
    """--experiment, once the flags that no run can take, whatever it trains, are refused."""
    if EXPERIMENT.value is None:
        raise UsageError("--experiment", "is required", f"e.g. {PROGRAM} --experiment mnist_deep")
    if SAVE_CHECKPOINTS_STEPS.present and SAVE_CHECKPOINTS_SECS.present:
        raise UsageError(
            "--save_checkpoints_steps",
            "and --save_checkpoints_secs exclude each other",
            "choose one",
        )
    # Here, not as the flag's upper bound: absl would then say of a 0 that it is not in
    # [1, 9223372036854775807].
    if TRAIN_STEPS.value >= 2**63:
        raise UsageError(
            "--train_steps",
            f"is {TRAIN_STEPS.value}, past the largest global step, 2**63 - 1",
            "train for fewer steps",
        )
    if DATA_DIR.value is not None and not Path(DATA_DIR.value).is_dir():
        # A typo would otherwise train on an experiment's fallback data, and succeed.
        raise UsageError(
            "--data_dir",
            f"{DATA_DIR.value!r} is not a directory",
            "give the directory that holds the data, or leave --data_dir out",
        )
    return EXPERIMENT.value


def _check_one_process() -> None:
    """The flags that only a cluster uses, in a process that trains alone: layout flags are
    said to change nothing (not refused: one --flagfile may serve a job's steps and a try on
    a workstation), --sync_replicas is refused."""
    if ignored := layout_flags.given_layout_flags():
        logging.warning(
            "%s: lay out the tasks of a SLURM step, and this trains in one process, so they "
            "change nothing here (--local_cluster=ps=1,workers=2 runs a cluster on this machine)",
            ", ".join(ignored),
        )
    if SYNC_REPLICAS.value:
        raise UsageError(
            "--sync_replicas",
            "synchronises the trainers of a cluster, and this trains in one process",
            "add --local_cluster=ps=1,workers=1, or run it in a SLURM step of several tasks",
        )


def _coordinated(task: lifecycle.TaskRun, hparams: str) -> int:
    """A task of a step laid out for ParameterServerStrategy (--coordinator), run as
    with-tfconfig runs a coordinator's script: each task supervises a child, which for a ps
    or a worker serves (backends/keras/serve.py), and for the chief (and the evaluator) is
    this command again, coordinating the training (evaluating its checkpoints) as the
    lifecycle's backend. The chief's supervisor so answers on its port once its child has
    exited, which ends the others (process/supervise.py)."""
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
    # The coordinator and the evaluator run this command again as their child; the others
    # serve.
    again = role.role in (CHIEF, EVALUATOR)
    if again and os.environ.get(_COORDINATING) == marker:
        lifecycle.run_to_exit(
            task, lifecycle.TF_KERAS_COORDINATOR, partial(_coordinator, task, hparams)
        )
    threads, said = _threads(task.place)
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
    group = supervise.command_group()
    group.start(command, environ)
    return supervise.supervise(group, role, None, supervise.WORKER_RESTARTS)


# Threads TensorFlow picks itself: every CPU.
_TENSORFLOW_S = Threads(0, 0)


def _settings(
    directory: Path,
    hparams: str,
    experiment: experiment_lib.Experiment | experiment_lib.KerasExperiment,
    threads: Threads = _TENSORFLOW_S,
) -> TrainingSettings:
    """The flags' settings, with the experiment's hparams overridden by `hparams` and passed
    by its check_hparams."""
    shard = input_shard(os.environ)
    return TrainingSettings(
        model_dir=directory,
        train_steps=TRAIN_STEPS.value,
        eval_steps=EVAL_STEPS.value,
        params={
            **hparams_lib.with_overrides(experiment.hparams, hparams, experiment.check_hparams),
            "batch_size": BATCH_SIZE.value,
            "data_dir": DATA_DIR.value,
            "num_trainers": shard.num_shards,
            "trainer_index": shard.shard_index,
        },
        save_checkpoints_steps=SAVE_CHECKPOINTS_STEPS.value,
        save_checkpoints_secs=SAVE_CHECKPOINTS_SECS.value,
        keep_checkpoint_max=KEEP_CHECKPOINT_MAX.value,
        intra_op_threads=threads.intra_op,
        inter_op_threads=threads.inter_op,
        gpu_memory_growth=GPU_MEMORY_GROWTH.value,
        gpu_memory_fraction=GPU_MEMORY_FRACTION.value,
        log_every_steps=LOG_EVERY_STEPS.value,
        sync_replicas=SYNC_REPLICAS.value,
    )


# Each backend below loads the experiment and checks the flags' settings against it before it
# imports TensorFlow itself: an experiment that does not import it at the top is refused
# within a fraction of a second rather than after TensorFlow's seconds of loading.


def _keras(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras experiment, and TensorFlow and tf-keras, as its backend."""
    # Keras 2 (tf-keras) for whatever the experiment reaches through tf.keras too.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    experiment, settings = _loaded(task, hparams, experiment_lib.load_keras)
    from tfconfig_slurm.backends.keras.train import KerasBackend  # noqa: PLC0415

    return KerasBackend(experiment, settings, task)


def _keras3(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras 3 experiment, and Keras 3 on JAX, as its backend."""
    experiment_lib.choose_jax(os.environ)
    experiment = experiment_lib.load_keras(EXPERIMENT.value or "")
    settings = _settings(task.model_dir, hparams, experiment)
    from tfconfig_slurm.backends.keras3.train import Keras3Backend  # noqa: PLC0415

    return Keras3Backend(experiment, settings, task)


def _coordinator(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras experiment, and TensorFlow and tf-keras, as the coordinator of a
    ParameterServerStrategy cluster, or as its evaluator (a sidecar)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    experiment, settings = _loaded(task, hparams, experiment_lib.load_keras)
    from tfconfig_slurm.backends.keras.coordinator import CoordinatorBackend  # noqa: PLC0415
    from tfconfig_slurm.backends.keras.sidecar import SidecarBackend  # noqa: PLC0415

    role = task.place.role
    assert role is not None
    if role.role == EVALUATOR:
        return SidecarBackend(experiment, settings, task)
    return CoordinatorBackend(experiment, settings, task)


def _estimator(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Estimator experiment, and TensorFlow, as its backend."""
    experiment, settings = _loaded(task, hparams, experiment_lib.load)
    from tfconfig_slurm.backends.estimator import experiment_training  # noqa: PLC0415
    from tfconfig_slurm.backends.estimator.train import EstimatorBackend  # noqa: PLC0415

    training = experiment_training.training(experiment, settings, task.place.role)
    return EstimatorBackend(training, task.place.role, task.stop)


_Loaded = TypeVar("_Loaded", experiment_lib.Experiment, experiment_lib.KerasExperiment)


def _loaded(
    task: lifecycle.TaskRun, hparams: str, load: Callable[[str], _Loaded]
) -> tuple[_Loaded, TrainingSettings]:
    """The experiment and the run's settings, with TensorFlow loaded (the experiment imports
    it), its thread pools held and its devices looked at, its start-up notes held back
    (process/native_noise.py)."""
    with native_noise.start_up_notes_held(bool(task.place.gpu_ids)):
        experiment = load(EXPERIMENT.value or "")
        threads, said = _threads(task.place)
        settings = _settings(task.model_dir, hparams, experiment, threads)
        if said:
            logging.info("%s", said)
        from tfconfig_slurm.backends import tf_process  # noqa: PLC0415

        tf_process.hold_threads(threads.intra_op, threads.inter_op)
        tf_process.look_at_devices()
    return experiment, settings


def _threads(where: place.Place) -> tuple[Threads, str]:
    """The task's TensorFlow threads: each flag where given (0: TensorFlow's own), else sized
    by its role and its node's share of the CPUs its process may run on (cluster/threads.py);
    TensorFlow's own in a single process. With the line that says them ("" where none is
    set), for the caller to log once its input has passed: a refusal stays one line."""
    cpus = len(os.sched_getaffinity(0))
    sized = (
        _TENSORFLOW_S
        if where.role is None
        else threads_lib.for_role(where.role, cpus, own_cpus=where.own_cpus)
    )
    given = Threads(
        sized.intra_op if INTRA_OP_THREADS.value is None else INTRA_OP_THREADS.value,
        sized.inter_op if INTER_OP_THREADS.value is None else INTER_OP_THREADS.value,
    )
    why = (
        "as the flags say"
        if given != sized
        else f"sized for {console.a_or_an(where.role.role if where.role else 'task')} on "
        f"{'its own' if where.own_cpus else 'the node'}'s {cpus} CPUs"
    )
    said = (
        f"TensorFlow's threads: {given.intra_op} inside an op, {given.inter_op} between ops ({why})"
    )
    return given, said if any(given) else ""


def _keras_layout(policy: LayoutPolicy, kind: str) -> LayoutPolicy:
    """A Keras experiment's layout: all-reduce (MultiWorkerMirroredStrategy, or a Keras 3
    experiment's processes on JAX), or with --coordinator ParameterServerStrategy's, with the
    flags it cannot honour refused."""
    on_jax = kind == experiment_lib.KERAS3
    threads = "--intra_op_threads" if INTRA_OP_THREADS.value else "--inter_op_threads"
    refused = {
        threads: (
            on_jax and bool(INTRA_OP_THREADS.value or INTER_OP_THREADS.value),
            "it sizes TensorFlow's thread pools, and a Keras 3 experiment trains on JAX",
        ),
        "--evaluator": (
            layout_flags.EVALUATOR.value and not policy.coordinator,
            "every trainer of an all-reduce run evaluates the final model (with --coordinator, "
            "an evaluator evaluates each checkpoint)",
        ),
        "--sync_replicas": (
            SYNC_REPLICAS.value,
            "ParameterServerStrategy's workers update the variables asynchronously, and cannot "
            "be made to wait for each other"
            if policy.coordinator
            else "all-reduce training is synchronous already",
        ),
        "--save_checkpoints_secs": (
            SAVE_CHECKPOINTS_SECS.value is not None,
            "checkpoints are numbered by step: use --save_checkpoints_steps",
        ),
        "--gpu_memory_growth": (GPU_MEMORY_GROWTH.value, "the Keras runtime does not set it yet"),
        "--gpu_memory_fraction": (
            GPU_MEMORY_FRACTION.value is not None,
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


def _sweep_run(sweep_file: Path, job: SlurmJob | None) -> tuple[str, str]:
    """This job array task's line of the sweep file after --hparams, and its default id."""
    if job is None or job.array_task_id is None:
        raise UsageError(
            "--sweep_file",
            "picks a line by SLURM_ARRAY_TASK_ID, and this is not a job array task",
            "submit the sweep with launch/sweep SWEEP_FILE [flags]",
        )
    lines = hparams_lib.sweep_lines(sweep_file)
    index = job.array_task_id
    if index >= len(lines):
        raise UsageError(
            "--sweep_file",
            f"has {len(lines)} runs, and this is array task {index}",
            "submit the sweep with launch/sweep, which asks for one array task a line",
        )
    hparams = hparams_lib.swept(HPARAMS.value, lines[index])
    return hparams, f"{sweep_file.stem}-{index}"


def _experiment_id(default_id: str, *, swept: bool) -> str:
    """--experiment_id, else $EXPERIMENT_ID, else `default_id`, checked to name one folder of
    the output root. A sweep's run is always its own <sweep>-<line>: an EXPERIMENT_ID exported
    in the shell that submitted the sweep would train every line in one directory."""
    given, culprit = EXPERIMENT_ID.value, "--experiment_id"
    if given is None and not swept:
        given, culprit = os.environ.get(ID_VARIABLE) or None, ID_VARIABLE
    if given is None:
        return default_id
    # Whitespace too: a newline split the runs table's line, and a job that goes on in a new
    # one passes the id through a shell's words.
    if given in ("", ".", "..") or any(
        c == "/" or c.isspace() or not c.isprintable() for c in given
    ):
        raise UsageError(
            culprit,
            f"is {given!r}, not the name of a folder",
            "give a name without '/' or spaces, e.g. lr5e-4: the run goes in <output root>/<id>, "
            "where tfconfig-slurm runs lists it",
        )
    model_dir.check_name(given, culprit)
    return given


def _default_id(experiment: str, job: SlurmJob | None) -> str:
    """The experiment's name, and in a job array the array task's index after it, so that the
    array's tasks train into directories of their own."""
    if job is not None and job.array_task_id is not None:
        return f"{experiment}-{job.array_task_id}"
    return experiment


def run() -> None:
    run_cli(PROGRAM, main, logs=True, tensorflow_log_level="1")


if __name__ == "__main__":
    run()

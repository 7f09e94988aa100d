"""Train an experiment with TensorFlow Estimator; run again with the same id to resume.

  python -m tfconfig_slurm.run --experiment mnist_deep
  python -m tfconfig_slurm.run --experiment path/to/my_model.py --train_steps=5000 \\
      --hparams=learning_rate=0.0005 --output_root=/scratch/$USER/runs --experiment_id=lr5e-4

An experiment is a module defining model_fn(features, labels, mode, params) and
input_fn(mode, params) (or train_input_fn and eval_input_fn), and optionally HPARAMS and
serving_input_receiver_fn. Checkpoints, TensorBoard events, summary.json and the exported
model go to <output_root>/<experiment_id>; a run that finds a checkpoint there resumes from it.

Where it runs decides how it trains:
  - with TF_CONFIG set (by launch/with-tfconfig or --local_cluster): that task of the cluster;
  - in a SLURM job step of several tasks: the task's role in the layout tfconfig-slurm
    computes (the layout flags below; see tfconfig-slurm --explain);
  - otherwise: in this one process. --local_cluster=ps=1,workers=2 starts a cluster of
    processes on this machine instead.
Parameter servers exit once every trainer has finished.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import flags, logging

from tfconfig_slurm import layout_flags, network
from tfconfig_slurm.cli import run_cli
from tfconfig_slurm.cluster import render
from tfconfig_slurm.cluster.layout import CHIEF, PS, WORKER
from tfconfig_slurm.cluster.step import in_job_step, read_slurm_job, read_slurm_step
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.runtime import claim, preemption
from tfconfig_slurm.runtime.role import ClusterRole

PROGRAM = "tfconfig-slurm-run"

EXPERIMENT = flags.DEFINE_string(
    "experiment",
    None,
    "The experiment: a name (NAME.py in ./experiments, else one that ships with the "
    "package: mnist_deep), a file path, or a module path.",
)
OUTPUT_ROOT = flags.DEFINE_string(
    "output_root",
    os.environ.get("TFCONFIG_SLURM_OUTPUT", "./tf-output"),
    "Where model directories go (default: $TFCONFIG_SLURM_OUTPUT, else ./tf-output).",
)
EXPERIMENT_ID = flags.DEFINE_string(
    "experiment_id",
    os.environ.get("EXPERIMENT_ID"),
    "The model directory's name under --output_root; the same id resumes, and only one run "
    "at a time may train there (default: $EXPERIMENT_ID, else the experiment's name, and in "
    "a SLURM job array <name>-<array task id>).",
)
PRINT_MODEL_DIR = flags.DEFINE_boolean(
    "print_model_dir",
    False,
    "Print the model directory these flags train in, and exit (for batch scripts).",
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
DATA_DIR = flags.DEFINE_string("data_dir", None, "Where the experiment reads its data from.")
SAVE_CHECKPOINTS_STEPS = flags.DEFINE_integer(
    "save_checkpoints_steps", None, "Checkpoint every N global steps.", lower_bound=1
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
    "intra_op_threads", 0, "Threads inside one op (0: TensorFlow picks).", lower_bound=0
)
INTER_OP_THREADS = flags.DEFINE_integer(
    "inter_op_threads",
    0,
    "Ops run at once (0: TensorFlow picks). With 1, a trainer in a cluster sends its "
    "gradients to the ps only once its whole backward pass is done; 2 lets them overlap.",
    lower_bound=0,
)
LOG_EVERY_STEPS = flags.DEFINE_integer(
    "log_every_steps",
    100,
    "Log the loss, examples/s and global steps/s, and write scalars, every N steps.",
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
    "ps=N,workers=N[,evaluator=1] (plus the chief). One log per task in <model dir>/logs.",
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
MAX_REQUEUES = flags.DEFINE_integer(
    "max_requeues",
    3,
    "Requeue the job on --preempt_signal only while SLURM_RESTART_COUNT is below this.",
    lower_bound=0,
)

flags.adopt_module_key_flags(layout_flags)


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
    if EXPERIMENT.value is None:
        raise UsageError("--experiment", "is required", f"e.g. {PROGRAM} --experiment mnist_deep")
    if SAVE_CHECKPOINTS_STEPS.present and SAVE_CHECKPOINTS_SECS.present:
        raise UsageError(
            "--save_checkpoints_steps",
            "and --save_checkpoints_secs exclude each other",
            "choose one",
        )
    # Checked before TensorFlow is imported, so that bad input fails at once.
    from tfconfig_slurm.runtime import experiment as experiment_lib  # noqa: PLC0415

    name, _ = experiment_lib.locate(EXPERIMENT.value)
    model_dir = Path(OUTPUT_ROOT.value, EXPERIMENT_ID.value or _default_id(name))
    if PRINT_MODEL_DIR.value:
        sys.stdout.write(f"{model_dir}\n")
        return 0
    role, node, gpus = _cluster_role()
    if role is not None:
        network.check_task(role)
    if SYNC_REPLICAS.value and role is None and not LOCAL_CLUSTER.value:
        raise UsageError(
            "--sync_replicas",
            "synchronises the trainers of a cluster, and this trains in one process",
            "add --local_cluster=ps=1,workers=1, or run it in a SLURM step of several tasks",
        )
    _check_writable(model_dir)
    if LOCAL_CLUSTER.value:
        return _run_local_cluster(model_dir)

    from tfconfig_slurm.runtime import train  # noqa: PLC0415  (imports TensorFlow)

    experiment = experiment_lib.load(EXPERIMENT.value)
    params = experiment_lib.with_overrides(experiment.hparams, HPARAMS.value)
    # Which share of the training data this process reads: trainer i of n reads shard i
    # (dataset.shard(n, i)); a single process and the evaluator read all of theirs.
    trainer = role if role is not None and role.role in (CHIEF, WORKER) else None
    params.update(
        batch_size=BATCH_SIZE.value,
        data_dir=DATA_DIR.value,
        num_trainers=trainer.trainers if trainer else 1,
        trainer_index=trainer.trainer_id if trainer else 0,
    )
    # Only now, with the input checked: bad input leaves nothing behind.
    held = _claim_model_dir(model_dir, role)
    resumed = train.resume_step(model_dir)
    logging.info(
        "%s on %s at %s with GPUs [%s], model directory %s, %s",
        f"{role.role} {role.index}" if role else "chief 0 (single process)",
        node,
        role.address if role else "-",
        gpus,
        model_dir,
        f"resuming from step {resumed}" if resumed is not None else "starting at step 0",
    )
    settings = train.TrainingSettings(
        model_dir=model_dir,
        train_steps=TRAIN_STEPS.value,
        eval_steps=EVAL_STEPS.value,
        batch_size=BATCH_SIZE.value,
        params=params,
        save_checkpoints_steps=SAVE_CHECKPOINTS_STEPS.value,
        save_checkpoints_secs=SAVE_CHECKPOINTS_SECS.value,
        keep_checkpoint_max=KEEP_CHECKPOINT_MAX.value,
        intra_op_threads=INTRA_OP_THREADS.value,
        inter_op_threads=INTER_OP_THREADS.value,
        gpu_memory_growth=GPU_MEMORY_GROWTH.value,
        gpu_memory_fraction=GPU_MEMORY_FRACTION.value,
        log_every_steps=LOG_EVERY_STEPS.value,
        sync_replicas=SYNC_REPLICAS.value,
    )
    train.hold_threads(settings)
    if role is not None:
        train.run_role(experiment, settings, role, stop)
        logging.info("%s %d: done", role.role, role.index)
        # The first ps sees every trainer finish, so it is the one to requeue the job.
        requeues = role.role == PS and role.index == 0
    else:
        summary = train.train_single_process(experiment, settings, stop)
        requeues = True
        if summary is not None:
            logging.info(
                "done at step %d in %.1f s: %s; checkpoints and events in %s, summary in %s",
                summary["global_step"],
                summary["wall_time_s"],
                train.metric_text(summary["eval"]),
                model_dir,
                model_dir / train.SUMMARY_FILE,
            )
    # A run stopped on a signal keeps its directory, to resume there (as a requeued job).
    if held is not None and not stop.requested:
        held.release()
    status = 0
    if stop.requested and requeues:
        status = preemption.after_stop(os.environ, stop.signal_name, requeue_on, MAX_REQUEUES.value)
    train.exit_now(status)


def _default_id(experiment: str) -> str:
    """The experiment's name, and in a job array the array task's index after it, so that the
    array's tasks train into directories of their own."""
    job = read_slurm_job(os.environ)
    if job is not None and job.array_task_id is not None:
        return f"{experiment}-{job.array_task_id}"
    return experiment


def _run_local_cluster(model_dir: Path) -> int:
    from tfconfig_slurm.runtime import local_cluster  # noqa: PLC0415

    counts = local_cluster.parse(LOCAL_CLUSTER.value or "")
    # The launcher holds the model directory for its tasks, which do not claim it.
    held = claim.claim(model_dir, claim.this_holder(os.environ))
    held.renew()
    try:
        return local_cluster.run(counts, model_dir, sys.argv[1:], PROGRAM)
    finally:
        held.release()


def _claim_model_dir(model_dir: Path, role: ClusterRole | None) -> claim.Claim | None:
    """Holds the model directory for this run (claim.py); returns the claim this task keeps
    renewed and releases at the end: the chief's, or a single process's."""
    if role is not None and (role.run_id or "").startswith(render.LOCAL_RUN_PREFIX):
        return None
    holder = claim.this_holder(os.environ)
    owner = role is None or role.role == CHIEF
    if not owner and holder.job is None:
        # Outside SLURM, only the chief can tell its own run from another.
        model_dir.mkdir(parents=True, exist_ok=True)
        return None
    held = claim.claim(model_dir, holder)
    if not owner:
        return None
    held.renew()
    return held


def _cluster_role() -> tuple[ClusterRole | None, str, str]:
    """This process's role, its node and its GPUs; no role for a single process.

    A TF_CONFIG given to this task wins (launch/with-tfconfig, --local_cluster; in a job step
    only one made for it, see layout_flags.given_tf_config); otherwise, inside a SLURM step of
    several tasks, the layout gives the role, and the task environment is set before
    TensorFlow starts.
    """
    node = socket.gethostname()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "as TensorFlow finds them")
    if LOCAL_CLUSTER.value:
        return None, node, gpus
    step = read_slurm_step(os.environ) if in_job_step(os.environ) else None
    given = layout_flags.given_tf_config(os.environ, step.shape if step else None)
    if given is not None:
        role = ClusterRole.from_json(given)
    elif step is not None and step.shape.num_tasks > 1:
        layout, rank = layout_flags.resolve_layout(os.environ)
        if rank is None:
            raise UsageError(
                "--nodelist",
                "plans a layout for tfconfig-slurm --explain; training takes its layout from "
                "the job step",
                "leave --nodelist out",
            )
        environment = render.task_environment(layout, rank)
        os.environ.update(environment)
        role = ClusterRole.from_json(environment["TF_CONFIG"])
        node, gpus = layout.task(rank).node, environment["CUDA_VISIBLE_DEVICES"]
    else:
        os.environ.pop("TF_CONFIG", None)
        return None, node, gpus
    if role.ps_count == 0:
        raise UsageError(
            "--ps_per_node" if given is None else "TF_CONFIG",
            "gives a cluster without parameter servers, which Estimator training needs",
            "use --ps_per_node=1 (the default)",
        )
    if role.role == PS:
        gpus = ""
    return role, node, gpus


# Less than this free, a run would fail at its first checkpoint, with a partial file left.
_MIN_FREE_BYTES = 64 * 2**20


def _check_writable(model_dir: Path) -> None:
    """Fails before anything is created when the model directory cannot be made or written."""
    existing = next(path for path in (model_dir, *model_dir.parents) if path.exists())
    if not existing.is_dir():
        raise UsageError(
            "--output_root",
            f"cannot hold {model_dir}: {existing} is a file, not a directory",
            "choose a directory, e.g. --output_root=/scratch/$USER/tf-output",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            "--output_root",
            f"cannot hold {model_dir}: {existing} is not writable",
            "choose a directory you can write, e.g. --output_root=/scratch/$USER/tf-output",
        )
    free = shutil.disk_usage(existing).free
    if free < _MIN_FREE_BYTES:
        raise UsageError(
            "--output_root",
            f"cannot hold {model_dir}: {existing} has only {free / 2**20:.1f} MiB free, and "
            "a checkpoint needs more (mnist_deep's: 40 MB)",
            "free some space, or choose another file system, e.g. "
            "--output_root=/scratch/$USER/tf-output",
        )


def run() -> None:
    # TensorFlow's C++ start-up notes are noise for a user; an explicit setting wins.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    run_cli(PROGRAM, main, logs=True)


if __name__ == "__main__":
    run()

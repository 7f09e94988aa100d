"""The runtime's flags (`python -m tfconfig_slurm.run`), defined once for the modules that read
them: the command (run.py), where its run trains (run_directory.py), its backends
(runtime_backends.py) and sweeps (sweep.py). Its layout flags are layout_flags.py's."""

from absl import flags

from tfconfig_slurm.commands import cli, layout_flags, max_restarts_flag

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
PRINT_MODEL_DIR = flags.DEFINE_boolean(
    "print_model_dir",
    False,
    "Print the model directory these flags train in, and exit (for batch scripts); on "
    "stderr, what training there would do: start a new run, resume one at its step, or find "
    "it trained already. A directory no task could train in (held by another live run, or "
    "trained by another backend or experiment) is refused here, in one line, with exit 2.",
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
    "The directory the experiment reads its data from (mnist_deep: the four MNIST IDX files, "
    "a run fails where one is not there; without this flag, the digits that ship with "
    "tfconfig-slurm).",
)
SAVE_CHECKPOINTS_STEPS = flags.DEFINE_integer(
    "save_checkpoints_steps",
    None,
    "Checkpoint every N global steps, and not by time. With neither this nor "
    "--save_checkpoints_secs: an Estimator experiment every 600 s (Estimator's default), a "
    "Keras one every 1000 steps or 600 s, whichever comes first, so that a restart or a "
    "lost job loses at most that much.",
    lower_bound=1,
)
SAVE_CHECKPOINTS_SECS = flags.DEFINE_integer(
    "save_checkpoints_secs",
    None,
    "Checkpoint every N seconds, and not by steps (the trainers of a Keras cluster agree on "
    "it at their stop checks, every 10 steps; a --coordinator at each epoch's end, every "
    "--log_every_steps steps).",
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
STEPS_PER_EXECUTION = flags.DEFINE_integer(
    "steps_per_execution",
    None,
    "A Keras 3 experiment: training steps run per call of Keras's step function, and so per "
    "call of the runtime's step callback, for a model whose steps are so small that the host's "
    "work between them shows (a few ms or less). Applied where the experiment's compile left "
    "Keras's default, 1. The run still ends at --train_steps, and checkpoints, stop checks and "
    "log lines fall on the first call's end at or after their step.",
    lower_bound=1,
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
HANG_TIMEOUT = flags.DEFINE_float(
    "hang_timeout",
    None,
    "Seconds a trainer may make no step before it is hung: every thread's Python stack goes "
    "into its log, the hung one (the one waiting in its own code, not in a collective) is "
    "named as the run's failure, and the step ends, to start again in the job from the "
    "latest checkpoint (--max_restarts); the same step hung again ends the job. At least 10 "
    "times the slowest step seen, and three times the bound for the first step. Default: "
    "$TFCONFIG_SLURM_HANG_TIMEOUT, else 300. 0: never.",
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

# Not --local_cluster: its launcher starts each task with --local_cluster= (none), last.
cli.refuse_empty(DATA_DIR, OUTPUT_ROOT)

"""--max_restarts, for the commands that start a failed step again (the runtime, whose
launch/train.sbatch reads it, and `tfconfig-slurm srun`): defined once, as absl refuses a flag
defined twice in one process."""

from absl import flags

MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts",
    2,
    "A job step that failed where no code of the run's did (a task killed, out of memory, or "
    "a peer that stopped answering) starts again in the same job, at most this many times "
    "(launch/train.sbatch, `tfconfig-slurm srun`): the run resumes from its latest "
    "checkpoint, losing at most a checkpoint interval, not the allocation. An error in the "
    "run's code, refused input, or a restart that failed before it trained a step ends the "
    "job; a restart trained where the runtime logged progress, or where the model "
    "directory's checkpoint index names a later step (a script whose checkpoints are "
    "elsewhere gets one restart). 0: never.",
    lower_bound=0,
)

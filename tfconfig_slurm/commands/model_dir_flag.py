"""--model_dir, for the commands that are told a run's directory (with-tfconfig, `tfconfig-slurm
srun`), and the directory it names, made: defined once, as absl refuses a flag defined twice
in one process."""

from pathlib import Path

from absl import flags

from tfconfig_slurm.errors import UsageError

MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "The run's model directory (the script's own, the same on every task): the first task of "
    "the step to fail (its command's exit status, or a peer it found lost) is recorded there, "
    "under failures/, and the chief says in state.json how the run went (running, done, "
    "stopped, failed); `tfconfig-slurm runs` lists it.",
)


def made() -> Path:
    """The directory --model_dir names, made where it is not there yet."""
    directory = Path(MODEL_DIR.value or "")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            "--model_dir",
            f"{str(directory)!r} cannot be made a directory ({error.strerror})",
            "name the directory your script trains in",
        ) from None
    return directory

"""--model_dir, for the commands that are told a run's directory (with-tfconfig, `tfconfig-slurm
srun`), and the directory it names, made: defined once, as absl refuses a flag defined twice
in one process."""

from pathlib import Path

from absl import flags

from tfconfig_slurm.commands import cli
from tfconfig_slurm.errors import UsageError

MODEL_DIR = flags.DEFINE_string(
    "model_dir",
    None,
    "The run's model directory (the script's own, the same on every task), where the run's "
    "records are: with-tfconfig records there the first task of the step to fail (under "
    "failures/) and how the run went (state.json), and tfconfig-slurm srun reads them and "
    "keeps its restarts there; `tfconfig-slurm runs` lists the run.",
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


cli.refuse_empty(MODEL_DIR)

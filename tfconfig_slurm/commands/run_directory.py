"""Where a run of the runtime trains (output root and experiment id), and how the user named
them, for the errors about the directory."""

from __future__ import annotations

import os
from pathlib import Path

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.commands import runtime_flags
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import claim, history, run_dir
from tfconfig_slurm.process.user_code import experiment as experiment_lib

ID_VARIABLE = "EXPERIMENT_ID"


def chosen(experiment: str, job: SlurmJob | None) -> tuple[Path, str]:
    """The model directory the flags choose for a run of `experiment` in `job`, and its
    --hparams (a sweep's line after them)."""
    hparams, default_id = runtime_flags.HPARAMS.value, experiment
    if job is not None and job.array_task_id is not None:
        # In a job array: the experiment's name, with the array task's index after it.
        default_id = f"{experiment}-{job.array_task_id}"
    sweep_file = runtime_flags.SWEEP_FILE.value
    if sweep_file:
        hparams, default_id = _swept(Path(sweep_file), job)
    return Path(output_root(), _experiment_id(default_id, swept=bool(sweep_file))), hparams


def output_root() -> str:
    """--output_root, else $TFCONFIG_SLURM_OUTPUT, else ./tf-output."""
    return runtime_flags.OUTPUT_ROOT.value or run_dir.output_root(os.environ)


def naming() -> claim.Naming:
    """How this command's user named the model directory, for the errors about it."""
    named = claim.CLI_NAMING
    if not runtime_flags.OUTPUT_ROOT.value and os.environ.get(run_dir.OUTPUT_ROOT_VARIABLE):
        named = named._replace(
            root=run_dir.OUTPUT_ROOT_VARIABLE,
            root_example=f"{run_dir.OUTPUT_ROOT_VARIABLE}=/scratch/$USER/tf-output",
        )
    if runtime_flags.SWEEP_FILE.value:
        named = of_sweep(named, Path(runtime_flags.SWEEP_FILE.value).stem)
    return named


def of_sweep(named: claim.Naming, sweep: str) -> claim.Naming:
    """`named`, for the runs of the sweep `sweep` (its file's stem), which take their ids
    from it: --experiment_id and EXPERIMENT_ID do not name them."""
    return named._replace(
        run="SWEEP_FILE",
        run_fix=f"give the sweep a file name of its own: its runs are named after it ({sweep}-0, "
        f"{sweep}-1, ...)",
    )


def _swept(sweep_file: Path, job: SlurmJob | None) -> tuple[str, str]:
    """This job array task's line of the sweep file after --hparams, and its default id."""
    if job is None or job.array_task_id is None:
        raise UsageError(
            "--sweep_file",
            "picks a line by SLURM_ARRAY_TASK_ID, and this is not a job array task",
            "submit the sweep with launch/sweep SWEEP_FILE [flags]",
        )
    lines = experiment_lib.sweep_lines(sweep_file)
    index = job.array_task_id
    if index >= len(lines):
        raise UsageError(
            "--sweep_file",
            f"has {len(lines)} runs, and this is array task {index}",
            "submit the sweep with launch/sweep, which asks for one array task a line",
        )
    hparams = experiment_lib.swept(runtime_flags.HPARAMS.value, lines[index])
    return hparams, f"{sweep_file.stem}-{index}"


def _experiment_id(default_id: str, *, swept: bool) -> str:
    """--experiment_id, else $EXPERIMENT_ID, else `default_id`, checked to name one folder of
    the output root. A sweep's run is always its own <sweep>-<line>: an EXPERIMENT_ID exported
    in the shell that submitted the sweep would train every line in one directory."""
    given, culprit = runtime_flags.EXPERIMENT_ID.value, "--experiment_id"
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
    history.check_name(given, culprit)
    return given

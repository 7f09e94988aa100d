"""Submit a sweep: one SLURM job array, one array task for each line of hparams.

  launch/sweep [--max_running=N] [--sbatch_option=OPTION ...] SWEEP_FILE [runtime flags]
  launch/sweep lr.sweep --experiment mnist_deep --train_steps 2000 --output_root /scratch/runs

SWEEP_FILE holds one --hparams value a line (learning_rate=0.001,dropout=0.3); blank lines and
lines starting with # are skipped. Array task i trains line i under the experiment id
<SWEEP_FILE's name without suffix>-i in the output root, with the runtime flags given (those of
python -m tfconfig_slurm.run, after SWEEP_FILE), through --batch_script and its layout
(launch/train.sbatch). sbatch's options come from --sbatch_option, SBATCH_* variables
(SBATCH_PARTITION, SBATCH_TIMELIMIT, ...) or the batch script's #SBATCH lines, in that order.
Every line is checked against the experiment's HPARAMS before anything is submitted; the lines
are kept in <output root>/sweeps/<name>.txt, which the array's tasks read. Prints the array's
job id.
`tfconfig-slurm runs OUTPUT_ROOT` then shows the runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import flags

from tfconfig_slurm.commands import run_directory, runtime_flags
from tfconfig_slurm.commands.cli import FLAG_ERRORS, flag_error, help_asked, run_cli
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import slurm_commands
from tfconfig_slurm.process.records import history
from tfconfig_slurm.process.records.run_dir import SWEEPS
from tfconfig_slurm.process.task import native_noise

PROGRAM = "sweep"
# How a user calls it, for the hints.
COMMAND = "launch/sweep"

MAX_RUNNING = flags.DEFINE_integer(
    "max_running",
    None,
    "At most N of the sweep's runs at once (sbatch --array=0-K%N).",
    lower_bound=1,
)
BATCH_SCRIPT = flags.DEFINE_string(
    "batch_script",
    None,
    "The batch script every array task runs (launch/sweep passes launch/train.sbatch).",
)
SBATCH_OPTIONS = flags.DEFINE_multi_string(
    "sbatch_option",
    [],
    "An option for sbatch, over the batch script's #SBATCH lines; repeat it for more, e.g. "
    "--sbatch_option=--nodes=1 --sbatch_option=--ntasks-per-node=2",
)
DRY_RUN = flags.DEFINE_boolean(
    "dry_run", False, "Check the sweep and print the sbatch command instead of running it."
)
_OWN_FLAGS = ("max_running", "batch_script", "sbatch_option", "dry_run")
# The runtime flags the sweep sets itself, for each run.
_SET_BY_SWEEP = ("experiment_id", "sweep_file", "local_cluster", "print_model_dir")
# sbatch's options the sweep sets itself: the array is its lines, and the job id is read.
_SBATCH_SET_BY_SWEEP = ("--array", "-a", "--parsable")


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        raise UsageError(
            "SWEEP_FILE", "missing", f"{COMMAND} [--max_running=N] SWEEP_FILE [runtime flags]"
        )
    sweep_file = Path(argv[1])
    runtime_flags = _runtime_flags(argv[2:])
    lines = _checked_sweep(sweep_file)
    kept, text = _kept(sweep_file, lines)
    array = f"0-{len(lines) - 1}" + (f"%{MAX_RUNNING.value}" if MAX_RUNNING.value else "")
    arguments = [
        f"--array={array}", f"--job-name={sweep_file.stem}",
        # One output file a run, named as the runs table names it: <sweep>-<job>_<line>.out.
        f"--output={sweep_file.stem}-%A_%a.out",
        *SBATCH_OPTIONS.value, str(BATCH_SCRIPT.value), *runtime_flags, f"--sweep_file={kept}",
    ]  # fmt: skip
    if DRY_RUN.value:
        sys.stdout.write(shlex.join(slurm_commands.sbatch_command(arguments)) + "\n")
        return 0
    job = _submitted(arguments, kept, text)
    sys.stdout.write(f"{job}\n")
    runs = (
        f"1 run {sweep_file.stem}-0"
        if len(lines) == 1
        else f"{len(lines)} runs {sweep_file.stem}-0 to {sweep_file.stem}-{len(lines) - 1}"
    )
    sys.stderr.write(
        f"{PROGRAM}: job array {job}: {runs} in {run_directory.output_root()}; see them with "
        f"tfconfig-slurm runs {run_directory.output_root()}\n"
    )
    return 0


def _runtime_flags(arguments: Sequence[str]) -> list[str]:
    """The runtime flags after SWEEP_FILE, parsed by the runtime's own definitions (a bad one
    fails here), less the sweep's own flags that came among them."""
    flags.FLAGS.set_gnu_getopt(True)
    try:
        stray = flags.FLAGS([PROGRAM, *arguments])[1:]
    except FLAG_ERRORS as error:
        # The sweep's own flags may come after SWEEP_FILE too.
        own = re.match(rf"flag --({'|'.join(_OWN_FLAGS)})=", str(error))
        whose = COMMAND if own else "tfconfig-slurm-run"
        raise flag_error(error, whose, [PROGRAM, *arguments]) from None
    if stray:
        raise UsageError(repr(stray[0]), "is not a flag", "runtime flags start with --")
    if help_asked():
        # Passed on to the jobs, where no one would read it.
        raise UsageError(
            "--help",
            "comes among the runtime flags after SWEEP_FILE, which go to every run's job: the "
            "jobs would get it, not you",
            f"ask for it alone: {COMMAND} --help",
        )
    # The runtime does not know the sweep's own flags.
    return _without_own_flags(list(arguments))


def _checked_sweep(sweep_file: Path) -> list[str]:
    """The sweep file's lines, once it and all the sweep would submit are checked."""
    if BATCH_SCRIPT.value is None or not Path(BATCH_SCRIPT.value).is_file():
        raise UsageError(
            "--batch_script",
            f"is {BATCH_SCRIPT.value!r}, not a file",
            "give a batch script such as launch/train.sbatch",
        )
    for option in SBATCH_OPTIONS.value:
        # Without its dashes, it would reach sbatch as the batch script's name.
        if not option.startswith("-"):
            raise UsageError(
                "--sbatch_option",
                f"is {option!r}, not an sbatch option",
                "give it as sbatch takes it, dashes and value in one: --sbatch_option=--nodes=1",
            )
        name = option.split("=", 1)[0]
        if name in _SBATCH_SET_BY_SWEEP or (name.startswith("-a") and name[1] != "-"):
            raise UsageError(
                "--sbatch_option",
                f"sets {name}, which the sweep sets itself (one array task a line)",
                "leave it out; --max_running=N caps the runs at once",
            )
    for name in _SET_BY_SWEEP:
        if flags.FLAGS[name].present:
            raise UsageError(
                f"--{name}",
                "is the sweep's to set",
                f"leave it out: run i of the sweep is {sweep_file.stem}-i",
            )
    # The file's name names its runs: a space would not survive a continuation job's command
    # line, and a leading dot would hide them.
    if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", sweep_file.stem):
        raise UsageError(
            "SWEEP_FILE",
            f"is named {sweep_file.stem!r}, and its runs would be {sweep_file.stem!r}-0, ...",
            "name it with letters, digits, '.', '_' and '-', not starting with '.', e.g. lr.sweep",
        )
    return _checked_lines(sweep_file)


def _kept(sweep_file: Path, lines: Sequence[str]) -> tuple[Path, str]:
    """Where the sweep's lines are kept under the output root, for the array's tasks to read,
    and their text; a sweep of the same name submitted before with other lines is refused."""
    kept = Path(run_directory.output_root(), SWEEPS, f"{sweep_file.stem}.txt").absolute()
    history.check_room(kept.parent, run_directory.naming())
    text = "".join(f"{line}\n" for line in lines)
    if kept.exists() and kept.read_text() != text:
        raise UsageError(
            "SWEEP_FILE",
            f"{sweep_file.stem} was submitted before with other lines ({kept}), and its runs "
            f"{sweep_file.stem}-0, ... would mix them",
            "give the new sweep a file name of its own; the same lines resume the old sweep",
        )
    return kept, text


def _submitted(arguments: Sequence[str], kept: Path, text: str) -> str:
    """The job id of the array sbatch's `arguments` submit, `text` written to `kept` first and
    removed where sbatch refused: a sweep never submitted does not bind its name to its lines."""
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch", "is not on PATH", "run the sweep on a SLURM login node")
    submitted_before = kept.exists()
    made = [folder for folder in (kept.parent, *kept.parent.parents) if not folder.exists()]
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    # As long as it takes: sbatch retries a busy slurmctld itself, and one killed after the
    # array was taken would leave it queued without its lines.
    submitted = slurm_commands.sbatch(arguments, seconds=None)
    if submitted.problem:
        if not submitted_before:
            kept.unlink()
        # Innermost first: the folders made for it, empty again.
        for folder in made:
            folder.rmdir()
        sys.stderr.write(submitted.said)
        if submitted.status is None:
            raise UsageError("sbatch", submitted.problem, "ask again once slurmctld answers")
        raise UsageError(
            "sbatch",
            f"refused the array (exit {submitted.status}), so nothing was submitted; its lines "
            "above say why",
            "fix what they name (an --sbatch_option, a #SBATCH line of the batch script, or "
            "SLURM_CONF); --dry_run prints the sbatch command",
        )
    return submitted.job_id


def _without_own_flags(arguments: list[str]) -> list[str]:
    """The arguments without the sweep's own flags (--max_running 2, --nodry_run, ...)."""
    own = {flag.name: flag for flag in map(flags.FLAGS.__getitem__, _OWN_FLAGS)}
    kept: list[str] = []
    words = iter(arguments)
    for word in words:
        name, equals, _ = word.lstrip("-").partition("=")
        if not word.startswith("-") or (name not in own and name[2:] not in own):
            kept.append(word)
        elif not equals and name in own and not own[name].boolean:
            next(words, None)
    return kept


def _checked_lines(sweep_file: Path) -> list[str]:
    """The sweep's lines, each checked against the experiment's HPARAMS, and its run directory
    as its task will check it at its start: one trained by another experiment or backend would
    refuse every task of the array, once submitted."""
    # Here, not at the top: the sweep's command reads no more than it needs.
    from tfconfig_slurm.commands import layout_flags, runtime_backends  # noqa: PLC0415
    from tfconfig_slurm.process.user_code import experiment as experiment_lib  # noqa: PLC0415

    lines = experiment_lib.sweep_lines(sweep_file)
    if not lines:
        raise UsageError(
            "SWEEP_FILE",
            f"{sweep_file} has no lines of hparams",
            "write one --hparams value a line, e.g. learning_rate=0.001,dropout=0.3",
        )
    # --experiment, or the runtime's default.
    spec = runtime_flags.EXPERIMENT.value or "mnist_deep"
    kind = experiment_lib.require_runtime(spec)
    if kind == experiment_lib.KERAS3:
        os.environ.update(experiment_lib.choose_jax(os.environ))
    # An experiment that imports TensorFlow 2.16+ would write its start-up notes here.
    with native_noise.start_up_notes_held(gpus_asked=False):
        load = (
            experiment_lib.load if kind == experiment_lib.ESTIMATOR else experiment_lib.load_keras
        )
        experiment = load(spec)
    for number, line in enumerate(lines):
        try:
            experiment_lib.with_overrides(
                experiment.hparams,
                experiment_lib.swept(runtime_flags.HPARAMS.value, line),
                experiment.check_hparams,
            )
        except UsageError as error:
            raise UsageError(
                f"SWEEP_FILE {sweep_file}, run {number} ({line!r})", error.problem, error.hint
            ) from None
    coordinator = layout_flags.step_policy().coordinator
    named = run_directory.of_sweep(run_directory.naming(), sweep_file.stem)
    root, count = run_directory.output_root(), len(lines)
    directories = (Path(root, f"{sweep_file.stem}-{number}") for number in range(count))
    runtime_backends.check_trainable(directories, spec, kind, coordinator, named)
    return lines


def run() -> None:
    # Quieter than a run's: the sweep loads the experiment only to check each line's hparams.
    run_cli(PROGRAM, main, stop_at_first_argument=True, tensorflow_log_level="2", command=COMMAND)


if __name__ == "__main__":
    run()

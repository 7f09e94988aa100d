"""The `tfconfig-slurm` command: the layout tool (tfconfig.py), or with `runs` first the table
of an output root's runs (runs.py), or with `srun` a batch script's job step, started again
where a task was lost (srun.py). Each defines its own flags, so only one is imported. With no
argument (what every task of a step runs), this task's TF_CONFIG, without importing absl.flags,
which is slow to import (bench/RESULTS.md, "resolve"); tfconfig.py prints through the same
function."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from typing import NoReturn

from tfconfig_slurm.cluster import ClusterLayout, LayoutPolicy, render
from tfconfig_slurm.cluster.layout import lay_out_step
from tfconfig_slurm.cluster.step import read_slurm_step
from tfconfig_slurm.errors import TfconfigSlurmError, UsageError
from tfconfig_slurm.process.console import fail

PROGRAM = "tfconfig-slurm"
_COMMANDS = ("runs", "srun")


def print_task(layout: ClusterLayout, rank: int, *, export: bool = False) -> None:
    """Prints the TF_CONFIG of `rank` (`export`: the shell lines of its task environment),
    and the idle-GPU warning, if any, on stderr."""
    warning = render.idle_gpus_warning(layout)
    if warning:
        sys.stderr.write(f"{PROGRAM}: warning: {warning}\n")
    sys.stdout.write(
        render.export_lines(layout, rank) if export else render.tf_config_json(layout, rank) + "\n"
    )


def run_without_flags() -> NoReturn:
    """The command with no argument: this task's TF_CONFIG in the default layout."""
    try:
        step = read_slurm_step(os.environ)
        layout = lay_out_step(step, LayoutPolicy())
    except TfconfigSlurmError as error:
        fail(PROGRAM, error.one_line())
    print_task(layout, step.rank)
    sys.exit(0)


def tfconfig_slurm() -> None:
    if len(sys.argv) == 1:
        run_without_flags()
    word = sys.argv[1]
    if word in _COMMANDS:
        del sys.argv[1]
        importlib.import_module(f"tfconfig_slurm.commands.{word}").run()
    if not word.startswith("-"):
        # The layout tool takes flags only: a word first is a command, mistyped or unknown.
        close = sorted(difflib.get_close_matches(word, _COMMANDS))
        guess = f"; did you mean {' or '.join(close)}?" if close else ""
        fail(
            PROGRAM,
            UsageError(
                repr(word),
                f"is not a command of {PROGRAM}{guess}",
                f"{PROGRAM} runs [OUTPUT_ROOT] lists the runs; {PROGRAM} --explain "
                "--nodelist='gpu[01-04]' plans a layout; --help says more",
            ).one_line(),
        )
    from tfconfig_slurm.commands import tfconfig  # noqa: PLC0415

    tfconfig.run()


if __name__ == "__main__":
    tfconfig_slurm()

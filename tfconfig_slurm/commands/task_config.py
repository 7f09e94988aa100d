"""This task's TF_CONFIG as `tfconfig-slurm` prints it with no argument (what every task of a
step runs), without importing absl.flags, which is slow to import (bench/RESULTS.md,
"resolve"); tfconfig.py prints through the same function."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from tfconfig_slurm.cluster import ClusterLayout, LayoutPolicy, render
from tfconfig_slurm.cluster.layout import lay_out_step
from tfconfig_slurm.cluster.step import read_slurm_step
from tfconfig_slurm.errors import TfconfigSlurmError
from tfconfig_slurm.process.console import fail

PROGRAM = "tfconfig-slurm"


def print_task(program: str, layout: ClusterLayout, rank: int, *, export: bool = False) -> None:
    """Prints the TF_CONFIG of `rank` (`export`: the shell lines of its task environment),
    and the idle-GPU warning, if any, on stderr."""
    warning = render.idle_gpus_warning(layout)
    if warning:
        sys.stderr.write(f"{program}: warning: {warning}\n")
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
    print_task(PROGRAM, layout, step.rank)
    sys.exit(0)

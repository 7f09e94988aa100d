"""Print this SLURM task's TF_CONFIG, or explain the layout of the whole step.

Run it in every task of a job step; each task works out the same cluster on its own:

  srun python -m tfconfig_slurm.tfconfig             # this task's TF_CONFIG JSON
  eval "$(python -m tfconfig_slurm.tfconfig --export)"  # export TF_CONFIG, CUDA_VISIBLE_DEVICES
  srun python -m tfconfig_slurm.tfconfig --explain   # the step's table, printed by rank 0

See a layout before submitting, without SLURM:

  tfconfig-slurm --explain --nodelist='gpu[01-04]' --ntasks_per_node=3 --gpus_per_node=2

By default each node runs --ps_per_node parameter servers (its first tasks) and trainers that
share its GPUs; the first trainer of the first node is the chief, the others are workers in
rank order. Flags can also come from a file: --flagfile=layout.flags.

  tfconfig-slurm runs [OUTPUT_ROOT]   # every run of an output root: see tfconfig-slurm runs --help
  tfconfig-slurm srun --model_dir=DIR -- [srun's options] COMMAND
                                      # in a batch script: srun, its step started again where a
                                      # task was lost; see tfconfig-slurm srun --help
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from collections.abc import Sequence

from absl import flags

from tfconfig_slurm.cluster import data_path, render
from tfconfig_slurm.commands import json_flag, layout_flags, plan_flags
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.commands.main import PROGRAM, print_task
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.task import hang_watch

EXPORT = flags.DEFINE_boolean(
    "export", False, "Print shell export lines for TF_CONFIG and CUDA_VISIBLE_DEVICES."
)
EXPLAIN = flags.DEFINE_boolean(
    "explain",
    False,
    "Print a table of every task: rank, node, role, index, address, GPUs. In a job step, "
    "rank 0 prints it and the other tasks nothing (in a heterogeneous step, the first task "
    "off the first component, which sees the GPUs).",
)
MODEL_BYTES = flags.DEFINE_string(
    "model_bytes",
    None,
    "With --explain: the size of the model's dense variables (e.g. 13MB, 1.5GiB; 4 bytes a "
    "float32 parameter), to print what each step asks of the busiest node's network in a "
    "parameter-server layout, and what one trainer a node would ask.",
)
LINK_GBITS = flags.DEFINE_float(
    "link_gbits",
    None,
    f"With --model_bytes: the nodes' network in Gbit/s (default "
    f"{data_path.DEFAULT_GBITS_PER_SECOND:g}, Ethernet; InfiniBand HDR is 200).",
)
flags.adopt_module_key_flags(json_flag)
flags.adopt_module_key_flags(layout_flags)
flags.adopt_module_key_flags(plan_flags)


def _restart_line(tasks: int) -> str:
    """What a lost task costs this layout."""
    restart = (
        "the step starts again in its job, from the latest checkpoint, where the batch script "
        "runs it through tfconfig-slurm srun (launch/train.sbatch does), at most --max_restarts "
        f"times: a restart costs the {tasks} tasks' start and the training since that "
        "checkpoint, at most one interval (600 s by default)"
    )
    lost = (
        "A lost worker's command is started again on its port while the coordinator goes on; a "
        "lost ps or coordinator ends the step"
        if layout_flags.COORDINATOR.value
        else "A lost task (killed, out of memory, or a peer that stops answering) ends the step"
    )
    cut_off = (
        "A node cut off: in a job submitted with --no-kill, the step starts again on the nodes "
        "left, laid out for them; in any other, Slurm ends the job (NODE_FAIL), and it goes on "
        "after a requeue or in a new job, without the node."
    )
    hung = (
        "A trainer of the runtime that makes no step for its --hang_timeout "
        f"({hang_watch.DEFAULT_SECONDS:.0f} s by default, at least "
        f"{hang_watch.SLOWEST_STEPS} times its slowest step) is hung: every thread's stack goes "
        "into its log, the hung one is named, not the peers waiting for it, and the step starts "
        "again as for a lost task, costing that timeout, "
        f"{timing.HANG_ACCOUNTS_SECONDS:.0f} s more and a restart; the same step hung again ends "
        "the job."
    )
    return textwrap.fill(f"{lost}: {restart}. {cut_off} {hung}", width=96) + "\n"


def main(argv: Sequence[str]) -> None:
    if EXPORT.value and EXPLAIN.value:
        raise UsageError("--export", "excludes --explain", "choose one")
    if json_flag.JSON.value and not EXPLAIN.value:
        raise UsageError("--json", "goes with --explain", "add --explain")
    model_bytes = _model_bytes()
    layout, rank = layout_flags.resolve_layout(os.environ)
    if not EXPLAIN.value:
        if rank is None:
            raise UsageError(
                "--nodelist",
                "plans a layout, so it goes with --explain",
                "outside a job step there is no task to print a TF_CONFIG for; add --explain",
            )
        print_task(layout, rank, export=EXPORT.value)
        return
    if rank is not None and rank != layout.reporting_rank:
        # Every task of the step has the same table: one copy is enough.
        return
    if json_flag.JSON.value:
        sys.stdout.write(json.dumps(render.explain_records(layout), indent=1) + "\n")
        return
    output = render.explain_table(layout)
    if rank is None:
        output = layout_flags.as_planned(output)
    if model_bytes is not None:
        path = data_path.data_path(layout, model_bytes)
        speed = LINK_GBITS.value or data_path.DEFAULT_GBITS_PER_SECOND
        output += (
            "(data path: estimated for layouts with parameter servers only)"
            if path is None
            else data_path.describe(path, speed, LINK_GBITS.value is not None)
        ) + "\n"
    if rank is None and layout_flags.PORT_BASE.value is None:
        output += (
            "(planned: a job's ports start at a base derived from its job and step ids, or at "
            "--port_base)\n"
        )
    sys.stdout.write(output + _restart_line(len(layout.roles)))


def _model_bytes() -> int | None:
    """--model_bytes, checked with --link_gbits; None when not given."""
    if (MODEL_BYTES.value is not None or LINK_GBITS.value is not None) and (
        not EXPLAIN.value or json_flag.JSON.value
    ):
        culprit = "--model_bytes" if MODEL_BYTES.value is not None else "--link_gbits"
        raise UsageError(culprit, "goes with the --explain table", "add --explain, without --json")
    if LINK_GBITS.value is not None and MODEL_BYTES.value is None:
        raise UsageError(
            "--link_gbits", "goes with --model_bytes", "e.g. --model_bytes=13MB --link_gbits=100"
        )
    if LINK_GBITS.value is not None and not 0 < LINK_GBITS.value < math.inf:
        raise UsageError(
            "--link_gbits",
            f"is {LINK_GBITS.value:g}, expected a finite number more than 0",
            "the network's speed in Gbit/s, e.g. --link_gbits=100",
        )
    return None if MODEL_BYTES.value is None else data_path.parse_bytes(MODEL_BYTES.value)


def run() -> None:
    run_cli(PROGRAM, main)


if __name__ == "__main__":
    run()

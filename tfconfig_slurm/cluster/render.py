"""What the layout looks like to its readers: TF_CONFIG, a task's environment, shell exports,
and the explain table."""

from __future__ import annotations

import json
import shlex
from typing import Any

from tfconfig_slurm.cluster import role
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, ROLES, ClusterLayout, Task, counted
from tfconfig_slurm.cluster.step import STEP_GPUS

EXPLAIN_KEYS = ("rank", "node", "local_id", "role", "index", "address", "gpus")


def tf_config(layout: ClusterLayout, rank: int) -> dict[str, Any]:
    """The TF_CONFIG of one rank, in the form `tf.estimator.RunConfig` reads."""
    return role.write(
        layout.cluster(),
        layout.roles[rank],
        layout.indices[rank],
        has_evaluator=EVALUATOR in layout.roles,
        run_id=layout.shape.run_id,
        coordinator=layout.coordinator,
        evaluator_address=layout.addresses[rank],
    )


def tf_config_json(layout: ClusterLayout, rank: int) -> str:
    # Compact, because TF_CONFIG of a large step travels through the environment.
    return json.dumps(tf_config(layout, rank), separators=(",", ":"))


def cuda_visible_devices(task: Task) -> str:
    """The task's CUDA_VISIBLE_DEVICES: its own GPUs, empty so that a ps takes no GPU memory."""
    return ",".join(task.gpus)


def task_environment(layout: ClusterLayout, rank: int) -> dict[str, str]:
    """What every command gives one rank's process: its TF_CONFIG, its GPUs, and STEP_GPUS (the
    step's GPUs, as step.py reads them)."""
    shape = layout.shape
    return {
        "TF_CONFIG": tf_config_json(layout, rank),
        "CUDA_VISIBLE_DEVICES": cuda_visible_devices(layout.task(rank)),
        STEP_GPUS: f"{shape.job_id}.{shape.step_id}:{','.join(shape.node_gpus)}",
    }


def export_lines(layout: ClusterLayout, rank: int) -> str:
    """Shell lines for `eval`: one rank's task environment."""
    return "".join(
        f"export {name}={shlex.quote(value)}\n"
        for name, value in task_environment(layout, rank).items()
    )


def explain_records(layout: ClusterLayout) -> list[dict[str, Any]]:
    """One JSON object per task, by rank, with its threads where the node's CPUs are known."""
    threads = role.layout_threads(layout, layout.shape.cpus_on_node)
    return [
        {key: getattr(task, key) for key in EXPLAIN_KEYS}
        | {"gpus": list(task.gpus)}
        | ({"intra_op_threads": threads[rank][0], "inter_op_threads": threads[rank][1]}
           if threads else {})
        for rank, task in enumerate(layout.tasks)
    ]  # fmt: skip


def summary_line(layout: ClusterLayout) -> str:
    shape = layout.shape
    # From the columns: building every Task again here would double --explain's work.
    evaluator_gpu = any(gpus for role, gpus in zip(layout.roles, layout.gpus) if role == EVALUATOR)
    idle = sum(map(len, layout.idle_gpus.values()))
    per = "GPU node" if shape.server_nodes else "node"
    use = "shared by its workers" if layout.coordinator else "1 per trainer"
    gpus = (
        f"{counted(len(shape.node_gpus), 'GPU')} per {per}, {use}"
        + (", 1 for the evaluator" if evaluator_gpu else "")
        + (f", {idle} idle" if idle else "")
        if shape.node_gpus
        else "no GPUs"
    )
    described = ", ".join(
        f"{count} {role}"
        + ("s" if count > 1 and role != PS else "")
        + (" (the coordinator)" if role == CHIEF and layout.coordinator else "")
        for role in ROLES
        if (count := layout.roles.count(role))
    )
    nodes = counted(len(shape.nodes), "node")
    if shape.server_nodes:
        nodes += f" ({len(shape.server_nodes)} CPU, for the parameter servers)"
    return (
        f"{nodes}, {counted(shape.num_tasks, 'task')} ({shape.distribution}): {described}; "
        f"{gpus}; ports from {layout.port_base}"
    )


def idle_gpus_warning(layout: ClusterLayout) -> str | None:
    """One line naming the GPUs no task uses and the #SBATCH line that would use them."""
    if not (idle := layout.idle_gpus):
        return None
    named = [f"{node}: {','.join(gpus)}" for node, gpus in list(idle.items())[:3]]
    node, gpus = max(idle.items(), key=lambda item: len(item[1]))
    tasks = layout.shape.tasks_per_node[layout.shape.nodes.index(node)]
    where = (
        f"GPUs idle on {len(idle)} of {counted(len(layout.shape.nodes), 'node')} "
        f"({'; '.join(named)}{'; ...' if len(idle) > 3 else ''}): "
    )
    if layout.coordinator:
        return (
            f"{where}no worker runs there (the coordinator takes none). HINT: a worker there "
            f"drives them, one task more a node: #SBATCH --ntasks-per-node={tasks + 1}"
        )
    return (
        f"{where}each trainer drives one GPU, and these nodes have fewer trainers than GPUs. "
        f"HINT: one trainer per GPU: #SBATCH --ntasks-per-node={tasks + len(gpus)}"
    )


def explain_table(layout: ClusterLayout) -> str:
    """A table of every task, one line each, under a one-line summary of the layout."""
    threads = role.layout_threads(layout, layout.shape.cpus_on_node)
    header = ("rank", "node", "local", "role", "index", "address:port", "gpus") + (
        ("threads",) if threads else ()
    )
    rows = [
        (*(str(getattr(task, key)) for key in EXPLAIN_KEYS[:-1]), ",".join(task.gpus) or "-")
        + ((str(threads[rank]),) if threads else ())
        for rank, task in enumerate(layout.tasks)
    ]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = [summary_line(layout)]
    lines.extend(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in [header, *rows]
    )
    if threads:
        lines.append(
            f"(threads: the runtime's TensorFlow tasks', inside an op + between ops, the node's "
            f"{layout.shape.cpus_on_node} CPUs shared out by role; --intra_op_threads and "
            "--inter_op_threads set them)"
        )
    if warning := idle_gpus_warning(layout):
        lines.append(f"(warning: {warning})")
    return "\n".join(lines) + "\n"

"""The rank-to-node map of a whole job step, as SLURM deals tasks to nodes (block or cyclic).

Every task computes the whole map, then checks its own entry against what SLURM told it, so a
task never builds a cluster that the others do not share.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tfconfig_slurm.cluster.step import BLOCK, CYCLIC, SlurmStep
from tfconfig_slurm.errors import SlurmEnvironmentError


@dataclass(frozen=True)
class Placement:
    """Where every rank runs, as columns by rank (a step can have tens of thousands): its
    node's index in the step's node list, and its local id on that node."""

    node_indices: tuple[int, ...]
    local_ids: tuple[int, ...]


def place_tasks(tasks_per_node: tuple[int, ...], distribution: str) -> Placement:
    """The place of every rank of the step."""
    if distribution == BLOCK:
        # itertools rather than a loop per rank, for large steps.
        return Placement(
            node_indices=tuple(
                itertools.chain.from_iterable(
                    map(itertools.repeat, itertools.count(), tasks_per_node)
                )
            ),
            local_ids=tuple(itertools.chain.from_iterable(map(range, tasks_per_node))),
        )
    if distribution == CYCLIC:
        # Round robin over the nodes, skipping a node once it holds its share: with tasks
        # per node 4(x2),1 SLURM puts ranks 0,3,5,7 on the first node.
        dealt = [0] * len(tasks_per_node)
        node_indices: list[int] = []
        local_ids: list[int] = []
        total = sum(tasks_per_node)
        while len(node_indices) < total:
            for node, count in enumerate(tasks_per_node):
                if dealt[node] < count:
                    node_indices.append(node)
                    local_ids.append(dealt[node])
                    dealt[node] += 1
        return Placement(tuple(node_indices), tuple(local_ids))
    raise ValueError(f"unknown distribution {distribution!r}")


def check_own_place(step: SlurmStep, placement: Placement) -> None:
    """Fails loudly when this task's computed place disagrees with what SLURM says it is."""
    node_index = placement.node_indices[step.rank]
    local_id = placement.local_ids[step.rank]
    node = step.shape.nodes[node_index]
    hint = (
        f"SLURM placed rank {step.rank} differently from {step.shape.distribution} "
        "distribution over the step's node list; launch with srun -m block or -m cyclic and "
        "do not set SLURM_* variables by hand"
    )
    if step.node_name is not None and step.node_name != node:
        raise SlurmEnvironmentError(
            "SLURMD_NODENAME",
            f"is {step.node_name!r}, but rank {step.rank} should run on {node}",
            hint,
        )
    if step.node_index != node_index:
        raise SlurmEnvironmentError(
            "SLURM_NODEID",
            f"is {step.node_index}, but rank {step.rank} should run on node {node_index} ({node})",
            hint,
        )
    if step.local_id != local_id:
        raise SlurmEnvironmentError(
            "SLURM_LOCALID",
            f"is {step.local_id}, but rank {step.rank} should be local task {local_id} on {node}",
            hint,
        )

"""A batch job's allocation (its nodes, and each node's tasks and CPUs) and the environment of
a step on the nodes it keeps after some left it.

Where a node of a job submitted with `--no-kill` fails, SLURM keeps the job on the nodes left,
but the batch script's variables still describe every node, and srun refuses a step they size
("SLURM_JOB_NUM_NODES environment variable conflicts with allocated node count"): the step is
started in an environment that describes the nodes left, and shares them with the failed step,
which Slurm may never complete. Pure: an environment in, a new one
out; step.py reads the variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

import hostlist


@dataclass(frozen=True)
class Allocation:
    """What a batch job holds, node by node in SLURM's order; the counts are None where its
    environment does not say them."""

    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] | None
    cpus_per_node: tuple[int, ...] | None

    def keeping(self, nodes: Sequence[str]) -> Allocation:
        """This allocation on those of its nodes in `nodes`, in its own order."""
        kept = [index for index, node in enumerate(self.nodes) if node in set(nodes)]
        return replace(
            self,
            nodes=tuple(self.nodes[index] for index in kept),
            tasks_per_node=_kept(self.tasks_per_node, kept),
            cpus_per_node=_kept(self.cpus_per_node, kept),
        )

    def step_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` (a batch script's), its allocation variables describing this one."""
        nodes = hostlist.collect_hostlist(list(self.nodes))
        built = dict(environ)
        built.update(
            SLURM_JOB_NODELIST=nodes,
            SLURM_NODELIST=nodes,
            SLURM_JOB_NUM_NODES=str(len(self.nodes)),
            SLURM_NNODES=str(len(self.nodes)),
            # srun --overlap. A step whose tasks on the nodes left had ended before their
            # node's failure was declared is never completed by Slurm 22.05: it holds their
            # CPUs for ever, and a step without it waits "Requested nodes are busy" (seen
            # here).
            SLURM_OVERLAP="1",
        )
        if self.tasks_per_node is not None:
            tasks = str(sum(self.tasks_per_node))
            built.update(
                SLURM_TASKS_PER_NODE=_counts(self.tasks_per_node),
                SLURM_NTASKS=tasks,
                SLURM_NPROCS=tasks,
            )
        if self.cpus_per_node is not None:
            built["SLURM_JOB_CPUS_PER_NODE"] = _counts(self.cpus_per_node)
        return built


def _kept(counts: tuple[int, ...] | None, kept: list[int]) -> tuple[int, ...] | None:
    return None if counts is None else tuple(counts[index] for index in kept)


def _counts(counts: tuple[int, ...]) -> str:
    """SLURM's form of a count per node: `3(x2),2`."""
    runs = [(count, len(list(same))) for count, same in groupby(counts)]
    return ",".join(f"{count}(x{times})" if times > 1 else str(count) for count, times in runs)

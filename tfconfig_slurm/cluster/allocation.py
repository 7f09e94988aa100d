"""A batch job's allocation (its nodes, and each node's tasks and CPUs) and the environment of
a step on the nodes it keeps after some left it.

Where a node of a `--no-kill` job fails, the batch script's variables still describe every
node, and srun refuses a step they size ("SLURM_JOB_NUM_NODES environment variable conflicts
with allocated node count"). Pure: an environment in, a new one out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

import hostlist


@dataclass(frozen=True)
class Allocation:
    """What a batch job holds, node by node in SLURM's order; a count is None where unknown."""

    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] | None
    cpus_per_node: tuple[int, ...] | None
    # The job's GPUs in all (sbatch --gpus=[type:]N, SLURM_GPUS), which srun asks for again.
    gpus: str | None = None

    def keeping(self, nodes: Sequence[str]) -> Allocation:
        """This allocation on those of its nodes in `nodes`, in its own order."""
        kept = [index for index, node in enumerate(self.nodes) if node in set(nodes)]
        return replace(
            self,
            nodes=tuple(self.nodes[index] for index in kept),
            tasks_per_node=_kept(self.tasks_per_node, kept),
            cpus_per_node=_kept(self.cpus_per_node, kept),
            gpus=_scaled(self.gpus, len(kept), len(self.nodes)),
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
            # srun --overlap: Slurm 22.05 may never complete the failed step, which then holds
            # the CPUs of the nodes left, and a step without it waits "Requested nodes are busy".
            SLURM_OVERLAP="1",
        )
        if self.tasks_per_node is not None:
            built["SLURM_TASKS_PER_NODE"] = _counts(self.tasks_per_node)
            # srun takes them for -n; SLURM sets them only for a job that asked for a count of
            # tasks (otherwise its tasks per node are its CPUs per node).
            for name in ("SLURM_NTASKS", "SLURM_NPROCS"):
                if name in environ:
                    built[name] = str(sum(self.tasks_per_node))
        if self.cpus_per_node is not None:
            built["SLURM_JOB_CPUS_PER_NODE"] = _counts(self.cpus_per_node)
        built.pop("SLURM_GPUS", None)
        if self.gpus is not None:
            built["SLURM_GPUS"] = self.gpus
        return built


def _kept(counts: tuple[int, ...] | None, kept: list[int]) -> tuple[int, ...] | None:
    return None if counts is None else tuple(counts[index] for index in kept)


def _scaled(gpus: str | None, kept: int, nodes: int) -> str | None:
    """A job's GPUs in all (`a100:8`), for `kept` of its `nodes` nodes; None where they cannot
    be shared out evenly (srun then asks for none by count)."""
    if gpus is None:
        return None
    kind, _, count = gpus.rpartition(":")
    if not count.isdigit() or int(count) * kept % nodes:
        return None
    return f"{kind}:{int(count) * kept // nodes}" if kind else str(int(count) * kept // nodes)


def _counts(counts: tuple[int, ...]) -> str:
    """SLURM's form of a count per node: `3(x2),2`."""
    runs = [(count, len(list(same))) for count, same in groupby(counts)]
    return ",".join(f"{count}(x{times})" if times > 1 else str(count) for count, times in runs)

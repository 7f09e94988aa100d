"""Each task's TensorFlow thread pools, sized by its role and its node's share of CPUs.

TensorFlow sizes a process's pools to every CPU it may run on, so two trainers on a node each
think they own every core. The trainers share the node's CPUs out (inside an op and between
ops alike); a parameter server, an evaluator and ParameterServerStrategy's coordinator keep
every CPU: a ps's ops run while trainers wait for them (held to 1 thread, it slowed training:
bench/RESULTS.md, "threads"), and an evaluator's final metrics would be slow on one. CPUs
SLURM bound to a task are its alone. Pure: the counts come in, nothing is read here.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, ClusterLayout, trainer_roles
from tfconfig_slurm.cluster.role import ClusterRole

# The fewest threads between ops of a ParameterServerStrategy worker: one held by the
# coordinator's request for a step, one at least to run the step's ops.
PS_WORKER_MIN_INTER_OP = 2


class Threads(NamedTuple):
    """A task's TensorFlow thread pools: threads inside one op, and ops run at once."""

    intra_op: int
    inter_op: int

    def __str__(self) -> str:
        return f"{self.intra_op}+{self.inter_op}"


def sized(role: str, *, cpus: int, trainers_on_node: int, coordinator: bool = False) -> Threads:
    """The threads of a task of `role` on `cpus` CPUs that the node's `trainers_on_node`
    trainers share (1 where the task's CPUs are its own)."""
    cpus = max(1, cpus)
    if role in trainer_roles(coordinator):
        share = max(1, cpus // max(1, trainers_on_node))
        if coordinator:
            # A ParameterServerStrategy worker's handler for a step waits on its inter-op pool
            # for the step's ops, run on the same pool: with 1 thread, a step whose ops leave
            # it (its input not ready) waits for ever (#55 item 5).
            return Threads(share, max(share, PS_WORKER_MIN_INTER_OP))
        return Threads(share, share)
    if role in (PS, CHIEF, EVALUATOR):
        return Threads(cpus, cpus)
    raise ValueError(f"no threads for a task of role {role!r}")


def for_role(role: ClusterRole, cpus: int, *, own_cpus: bool) -> Threads:
    """The threads of the task `role`, whose process may run on `cpus` CPUs: its own where
    `own_cpus`, else shared with the trainers whose addresses are on its host."""
    host = _host(role.address)
    on_node = sum(
        _host(address) == host
        for job in trainer_roles(role.coordinator)
        for address in role.cluster.get(job, ())
    )
    return sized(
        role.role,
        cpus=cpus,
        trainers_on_node=1 if own_cpus else on_node,
        coordinator=role.coordinator,
    )


def for_layout(layout: ClusterLayout, cpus: int) -> list[Threads]:
    """Every task's threads, by rank, where each node's tasks share its `cpus` CPUs."""
    trainers = trainer_roles(layout.coordinator)
    on_node = Counter(task.node for task in layout.tasks if task.role in trainers)
    return [
        sized(
            task.role,
            cpus=cpus,
            trainers_on_node=on_node[task.node],
            coordinator=layout.coordinator,
        )
        for task in layout.tasks
    ]


def _host(address: str) -> str:
    return address.rpartition(":")[0]

"""Each task's TensorFlow thread pools, sized by its role and its node's share of CPUs.

TensorFlow sizes a process's pools to every CPU it may run on, so a node that runs a parameter
server and two trainers runs two trainers that each think they own every core. The trainers
share them out; the others keep what their work needs:

- a trainer (chief or worker): the CPUs over the trainers that share them, inside an op and
  between ops alike (TensorFlow's own default gives both every CPU);
- a parameter server: every CPU, as TensorFlow gives it: its ops (reads and updates of the
  variables) run while trainers wait for them, and held to 1 inside an op, 1 trainer and a ps
  on 2 cores trained 3% slower than the stock job (bench/RESULTS.md, "threads");
- an evaluator, and ParameterServerStrategy's coordinator (the chief of a --coordinator
  layout, which trains nothing itself: its workers are the trainers): every CPU, as a
  parameter server. An Estimator run's evaluator computes its final metrics, which one
  thread would slow on a CPU node; between checkpoints it waits.

Where SLURM bound the task to CPUs of its own, they are its alone, not shared. Pure: the
counts come in (for_role, for_layout), nothing is read here.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER, ClusterLayout
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
    """The threads of a task of `role` that may run on `cpus` CPUs, which the node's
    `trainers_on_node` trainers share (1 where the task's CPUs are its own), in a layout for
    ParameterServerStrategy where `coordinator`."""
    cpus = max(1, cpus)
    if role in _trainers(coordinator):
        share = max(1, cpus // max(1, trainers_on_node))
        if coordinator:
            # A ParameterServerStrategy worker runs each step the coordinator sends it in a
            # handler on its inter-op pool, which waits there for the step's ops, run on the
            # same pool: with 1 thread, a step whose ops leave it (its input not ready) waits
            # for ever (#55 item 5).
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
        for job in _trainers(role.coordinator)
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
    trainers = _trainers(layout.coordinator)
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


def _trainers(coordinator: bool) -> tuple[str, ...]:
    """The roles that train: ParameterServerStrategy's coordinator trains nothing itself."""
    return (WORKER,) if coordinator else (CHIEF, WORKER)


def _host(address: str) -> str:
    return address.rpartition(":")[0]

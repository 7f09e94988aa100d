"""Which peers each task of a cluster watches (watchdog.py), so that a loss reaches every task
while no task probes more than a few (a ps that probed all of 4,000 trainers took too long a
round: bench/RESULTS.md). No TensorFlow here.

- Trainers and parameter servers are paired off: with m = min(trainers, ps), trainer t and
  ps p watch each other when t % m == p % m; the parameter servers also watch each other. A
  lost trainer is seen by its ps, which ends; the mesh sees that ps end, and every trainer
  its own ps: three watches from any task to any other.
- Without parameter servers (all-reduce), each trainer watches its parent and children in the
  tree of trainers; one whose collective fails probes the others (`other_trainers`).
- With a coordinator (ParameterServerStrategy), a lost worker is the coordinator's to
  tolerate: nobody watches the workers. The coordinator watches every ps; its end travels to
  ps 0, from there to the other parameter servers (`herald`), and from each ps to its workers.

with-tfconfig's trainers tell the parameter servers they finished along the same tree (the
chief its root, FAN_OUT children each): each waits for its children's subtrees, then says so
for its own (supervise.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from tfconfig_slurm.cluster.layout import CHIEF, PS, WORKER
from tfconfig_slurm.cluster.role import ClusterRole, TaskId

FAN_OUT = 16
_CHIEF = str(TaskId(CHIEF, 0))


def paired(role: ClusterRole) -> dict[str, str]:
    """The peers of the other kind this trainer or ps watches, by name."""
    trainers, servers = role.trainers, role.ps_count
    if not trainers or not servers:
        return {}
    pairs = min(trainers, servers)
    if role.role == PS:
        mine = role.index % pairs
        return _trainers(role, (t for t in range(trainers) if t % pairs == mine))
    mine = role.trainer_id % pairs
    return {str(TaskId(PS, p)): role.cluster[PS][p] for p in range(servers) if p % pairs == mine}


def herald(role: ClusterRole) -> dict[str, str]:
    """Whose FINISHED ends a serving task's command, by name: the chief's for ps 0, ps 0's for
    the other ps, and with a coordinator, a worker's paired parameter servers'."""
    if role.role == PS:
        if role.index == 0:
            return {_CHIEF: role.cluster[CHIEF][0]}
        return {str(TaskId(PS, 0)): role.cluster[PS][0]}
    return paired(role) if role.coordinator and role.role == WORKER else {}


def paired_workers(role: ClusterRole) -> dict[str, str]:
    """The workers among a ps's paired trainers (with a coordinator, they serve until it ends)."""
    return {name: address for name, address in paired(role).items() if name != _CHIEF}


def neighbours(role: ClusterRole) -> dict[str, str]:
    """A trainer's parent and children in the tree of trainers, by name."""
    near = children(role)
    if role.trainer_id:
        near.update(_trainers(role, [_parent_id(role.trainer_id)]))
    return near


def other_servers(role: ClusterRole) -> dict[str, str]:
    """Every parameter server but this one: the mesh a ps watches."""
    return {name: address for name, address in role.named(PS).items() if name != str(role.task_id)}


def other_trainers(role: ClusterRole) -> dict[str, str]:
    """Every trainer but this one, by name, from the one after it round to the one before: the
    peers a trainer whose collective failed probes in turn, each starting elsewhere."""
    after = range(role.trainer_id + 1, role.trainer_id + role.trainers)
    return _trainers(role, (t % role.trainers for t in after))


def children(role: ClusterRole) -> dict[str, str]:
    """This trainer's children in the tree of trainers, by name."""
    return _trainers(role, _child_ids(role.trainer_id, role.trainers))


def parent(role: ClusterRole) -> str | None:
    """The address of this trainer's parent in the tree of trainers; None for the chief."""
    return role.trainer_address(_parent_id(role.trainer_id)) if role.trainer_id else None


def trainers_below(role: ClusterRole) -> int:
    """How many trainers the tree has below this one."""
    count, level = 0, [role.trainer_id]
    while level:
        level = [child for parent in level for child in _child_ids(parent, role.trainers)]
        count += len(level)
    return count


def _trainers(role: ClusterRole, trainer_ids: Iterable[int]) -> dict[str, str]:
    """These trainers' addresses by name, looked up one by one: building every name for each
    task would be quadratic."""
    return {role.trainer_name(t): role.trainer_address(t) for t in trainer_ids}


def _parent_id(trainer_id: int) -> int:
    return (trainer_id - 1) // FAN_OUT


def _child_ids(trainer_id: int, trainers: int) -> range:
    first = trainer_id * FAN_OUT + 1
    return range(first, min(first + FAN_OUT, trainers))

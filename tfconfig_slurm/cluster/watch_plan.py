"""Which peers each task of a cluster watches (watchdog.py), so that a loss reaches every task
while no task probes more than a few: at 500 nodes x 8 GPUs (4,000 trainers, 500 ps) a ps
that probed every trainer took 80 s a round (bench/RESULTS.md). No TensorFlow here.

- Trainers and parameter servers are paired off: with m = min(trainers, ps), trainer t and
  ps p watch each other when t % m == p % m. Each trainer so watches ceil(ps / trainers)
  parameter servers (1 at that scale), and each ps ceil(trainers / ps) trainers (8).
- The parameter servers watch each other (the mesh), at the watchdog's rate limit.

A lost trainer is seen by its ps, which ends; the other parameter servers see that ps end,
and end; every trainer sees its own ps end. A lost ps is seen by its trainers and by the mesh
the same way. Three watches from any task to any other.

A cluster without parameter servers (all-reduce training) has only trainers: each watches its
neighbours in the tree of trainers below (its parent and children), so a loss travels along
the tree, at most twice its depth (3 levels at 4,000 trainers). A trainer whose collective
fails probes the other trainers in turn until one refuses or the run has recorded its
failure: the few whose collective fails first name the lost one, whichever their neighbours
are, at once where the error names its address.

In a step laid out for ParameterServerStrategy (`coordinator`), a lost worker is the
coordinator's to tolerate: nobody watches the workers. The coordinator watches every ps; the
end travels from it to ps 0, from ps 0 to the other parameter servers (`herald`), and from
each ps to its paired workers, which serve until then.

`launch/with-tfconfig`'s trainers also tell the parameter servers that they finished, which
the runtime's trainers do through its stop tokens: along a tree of the trainers (the chief
its root, FAN_OUT children each), a trainer whose command exited 0 waits until each of its
children says its subtree finished, then says so for its own (supervise.py), until its
parent has said so too. The chief so says when every trainer has finished.
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
    the other parameter servers, and with a coordinator, a worker's paired parameter
    servers'."""
    if role.role == PS:
        if role.index == 0:
            return {str(TaskId(CHIEF, 0)): role.cluster[CHIEF][0]}
        return {str(TaskId(PS, 0)): role.cluster[PS][0]}
    return paired(role) if role.coordinator and role.role == WORKER else {}


def paired_workers(role: ClusterRole) -> dict[str, str]:
    """The workers among a ps's paired trainers: with a coordinator, the ones that serve until
    it says FINISHED."""
    return {name: address for name, address in paired(role).items() if name != _CHIEF}


def neighbours(role: ClusterRole) -> dict[str, str]:
    """A trainer's parent and children in the tree of trainers, by name: the peers it watches
    in a cluster without parameter servers."""
    near = children(role)
    if role.trainer_id:
        near.update(_trainers(role, [_parent_id(role.trainer_id)]))
    return near


def other_servers(role: ClusterRole) -> dict[str, str]:
    """Every parameter server but this one: the mesh a ps watches."""
    return {name: address for name, address in role.named(PS).items() if name != _own(role)}


def other_trainers(role: ClusterRole) -> dict[str, str]:
    """Every trainer but this one, by name, from the one after it on (round to the one
    before): the peers a trainer whose collective failed probes in turn
    (watchdog.PeerWatch.end_for_a_lost_peer), each trainer starting elsewhere."""
    after = range(role.trainer_id + 1, role.trainer_id + role.trainers)
    return _trainers(role, (t % role.trainers for t in after))


def children(role: ClusterRole) -> dict[str, str]:
    """This trainer's children in the tree of trainers, by name."""
    return _trainers(role, _child_ids(role.trainer_id, role.trainers))


def parent(role: ClusterRole) -> str | None:
    """The address of this trainer's parent in the tree of trainers; None for the chief."""
    if role.trainer_id == 0:
        return None
    return role.trainer_address(_parent_id(role.trainer_id))


def trainers_below(role: ClusterRole) -> int:
    """How many trainers the tree has below this one."""
    count, level = 0, [role.trainer_id]
    while level:
        level = [child for parent in level for child in _child_ids(parent, role.trainers)]
        count += len(level)
    return count


def _trainers(role: ClusterRole, trainer_ids: Iterable[int]) -> dict[str, str]:
    """These trainers' addresses by name; looked up one by one, as a cluster of thousands
    would make building every name for each task quadratic."""
    return {role.trainer_name(t): role.trainer_address(t) for t in trainer_ids}


def _parent_id(trainer_id: int) -> int:
    return (trainer_id - 1) // FAN_OUT


def _child_ids(trainer_id: int, trainers: int) -> range:
    first = trainer_id * FAN_OUT + 1
    return range(first, min(first + FAN_OUT, trainers))


def _own(role: ClusterRole) -> str:
    return str(role.task_id)

"""watch_plan.py: which peers each task watches. A loss must reach every task within three
watches while no task watches more than its share; checked on small clusters exactly and on
every shape up to 40 x 16 by walking the watches."""

from __future__ import annotations

import itertools

import pytest

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.role import ClusterRole


def cluster(trainers: int, servers: int) -> dict[str, tuple[str, ...]]:
    jobs = {"chief": ("h:1",), "ps": tuple(f"h:{100 + p}" for p in range(servers))}
    if trainers > 1:
        jobs["worker"] = tuple(f"h:{1000 + w}" for w in range(trainers - 1))
    return jobs


def roles(trainers: int, servers: int) -> dict[str, ClusterRole]:
    jobs = cluster(trainers, servers)
    return {
        f"{job} {index}": ClusterRole(jobs, job, index)
        for job, addresses in jobs.items()
        for index in range(len(addresses))
    }


def watched(role: ClusterRole) -> set[str]:
    """Every peer a task watches for loss (a ps also its mesh; without ps, a trainer its
    neighbours in the tree)."""
    if not role.ps_count:
        return set(watch_plan.neighbours(role))
    peers = set(watch_plan.paired(role))
    if role.role == "ps":
        peers |= set(watch_plan.other_servers(role))
    return peers


def test_two_by_two_pairs_the_chief_with_ps_0_and_the_worker_with_ps_1() -> None:
    tasks = roles(2, 2)
    assert set(watch_plan.paired(tasks["chief 0"])) == {"ps 0"}
    assert set(watch_plan.paired(tasks["worker 0"])) == {"ps 1"}
    assert set(watch_plan.paired(tasks["ps 1"])) == {"worker 0"}
    assert set(watch_plan.other_servers(tasks["ps 1"])) == {"ps 0"}


def test_at_500_nodes_x_8_gpus_a_ps_watches_8_trainers_and_a_trainer_1_ps() -> None:
    jobs = cluster(4000, 500)
    ps = ClusterRole(jobs, "ps", 7)
    worker = ClusterRole(jobs, "worker", 3999 - 1)
    assert len(watch_plan.paired(ps)) == 8
    assert len(watch_plan.paired(worker)) == 1
    assert len(watch_plan.other_servers(ps)) == 499
    chief = ClusterRole(jobs, "chief", 0)
    assert len(watch_plan.children(chief)) == watch_plan.FAN_OUT
    assert watch_plan.trainers_below(chief) == 3999


@pytest.mark.parametrize(("trainers", "servers"), [(1, 3), (3, 2), (17, 1), (40, 5), (300, 7)])
def test_the_tree_of_trainers_holds_each_trainer_once_below_the_chief(
    trainers: int, servers: int
) -> None:
    tasks = roles(trainers, servers)
    below = [
        name for role in tasks.values() if role.role != "ps" for name in watch_plan.children(role)
    ]
    assert sorted(below) == sorted(name for name in tasks if name.startswith("worker"))
    assert watch_plan.trainers_below(tasks["chief 0"]) == trainers - 1


def test_a_loss_reaches_every_task_within_three_watches() -> None:
    for trainers, servers in itertools.product(range(1, 41), range(1, 17)):
        tasks = roles(trainers, servers)
        watches = {name: watched(role) for name, role in tasks.items()}
        watchers: dict[str, set[str]] = {name: set() for name in tasks}
        for watcher, peers in watches.items():
            for peer in peers:
                watchers[peer].add(watcher)
        share = -(-max(trainers, servers) // min(trainers, servers))
        for name, role in tasks.items():
            # No task watches more than its share of the other kind.
            assert len(watch_plan.paired(role)) <= share
            ended, front = {name}, {name}
            for _ in range(3):
                front = {watcher for lost in front for watcher in watchers[lost]} - ended
                ended |= front
            assert ended == set(tasks), (trainers, servers, name, set(tasks) - ended)


def test_without_parameter_servers_a_loss_travels_the_tree_of_trainers() -> None:
    """All-reduce: a trainer watches at most its parent and FAN_OUT children, and a loss
    reaches every trainer within twice the tree's depth."""
    for trainers in (1, 2, 17, 18, 300, 4000):
        tasks = roles(trainers, 0)
        watchers: dict[str, set[str]] = {name: set() for name in tasks}
        for name, role in tasks.items():
            peers = watched(role)
            assert len(peers) <= watch_plan.FAN_OUT + 1
            for peer in peers:
                watchers[peer].add(name)
        depth = 0
        while watch_plan.FAN_OUT**depth < trainers:
            depth += 1
        for name in ("chief 0", f"worker {trainers - 2}" if trainers > 1 else "chief 0"):
            ended, front = {name}, {name}
            for _ in range(2 * depth):
                front = {watcher for lost in front for watcher in watchers[lost]} - ended
                ended |= front
            assert ended == set(tasks), (trainers, name)


def test_a_trainer_s_other_trainers_start_after_it_and_leave_it_out() -> None:
    """Each trainer whose collective failed probes them in turn, each from its own place:
    not every one of thousands at the chief first."""
    tasks = roles(4, 0)
    assert list(watch_plan.other_trainers(tasks["worker 1"])) == ["worker 2", "chief 0", "worker 0"]
    assert list(watch_plan.other_trainers(tasks["chief 0"])) == ["worker 0", "worker 1", "worker 2"]
    assert watch_plan.other_trainers(tasks["worker 2"])["chief 0"] == tasks["chief 0"].address

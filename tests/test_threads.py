"""Each task's TensorFlow threads, sized by its role and its node's share of CPUs
(cluster/role.py): what --explain says of every task is what the task itself takes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.slurm_envs import task_env
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step, render
from tfconfig_slurm.cluster.role import ClusterRole, Threads, layout_threads, sized_threads


@pytest.mark.parametrize(
    ("role", "cpus", "trainers_on_node", "expected"),
    [
        # 2 trainers and a ps on 2 cores: 1 each, the ps every CPU, as TensorFlow gives it.
        ("chief", 2, 2, Threads(1, 1)),
        ("ps", 2, 2, Threads(2, 2)),
        # A trainer alone with a ps keeps every CPU, as TensorFlow would give it.
        ("worker", 2, 1, Threads(2, 2)),
        # 8 GPUs' trainers on 64 CPUs.
        ("worker", 64, 8, Threads(8, 8)),
        # More trainers than CPUs: one each, not none.
        ("worker", 2, 5, Threads(1, 1)),
        ("evaluator", 16, 2, Threads(16, 16)),
    ],
)
def test_a_task_s_threads_follow_its_role_and_its_node_s_share(
    role: str, cpus: int, trainers_on_node: int, expected: Threads
) -> None:
    assert sized_threads(role, cpus=cpus, trainers_on_node=trainers_on_node) == expected


@pytest.mark.parametrize(
    ("tasks_per_node", "policy"),
    [
        ([3, 3], LayoutPolicy()),
        ([5, 4, 4], LayoutPolicy(ps_per_node=2)),
        ([2, 2], LayoutPolicy(all_reduce=True)),
        ([4, 4], LayoutPolicy(evaluator=True)),
        ([3, 3], LayoutPolicy(coordinator=True)),
    ],
)
def test_what_explain_says_of_every_task_is_what_the_task_takes(
    tasks_per_node: list[int], policy: LayoutPolicy
) -> None:
    """The table's threads (from the layout) against each task's own (from its TF_CONFIG, as
    the runtime sizes them), for every rank of the step."""
    nodes = [f"node{i}" for i in range(len(tasks_per_node))]
    ranks = sum(tasks_per_node)
    step = read_slurm_step(task_env(nodes, tasks_per_node, 0))
    explained = layout_threads(lay_out_step(step, policy), 16)
    for rank in range(ranks):
        own = read_slurm_step(task_env(nodes, tasks_per_node, rank))
        layout = lay_out_step(own, policy)
        role = ClusterRole.from_tf_config(render.tf_config(layout, rank))
        assert role.threads(16, own_cpus=False) == explained[rank], rank


def test_a_parameter_server_strategy_worker_keeps_2_threads_between_ops() -> None:
    """Its inter-op pool runs both the coordinator's request for a step, which waits there
    for the step, and the step's ops: 2 workers on 2 cores, 1 thread each, hung (#55 item 5)."""
    assert sized_threads("worker", cpus=2, trainers_on_node=2, coordinator=True) == (1, 2)
    assert sized_threads("worker", cpus=2, trainers_on_node=2) == (1, 1)


def test_parameter_server_strategy_s_coordinator_is_no_trainer() -> None:
    """In a --coordinator layout the workers share the node; the coordinator, which trains
    nothing, keeps every CPU, as a ps does."""
    step = read_slurm_step(task_env(["node1", "node2"], [3, 3], 0))
    layout = lay_out_step(step, LayoutPolicy(coordinator=True))
    sized = layout_threads(layout, 8)
    assert [(task.role, str(each)) for task, each in zip(layout.tasks, sized)] == [
        ("ps", "8+8"), ("chief", "8+8"), ("worker", "8+8"),
        ("ps", "8+8"), ("worker", "4+4"), ("worker", "4+4"),
    ]  # fmt: skip


def test_a_task_slurm_bound_to_cpus_of_its_own_shares_them_with_none() -> None:
    environ = task_env(["node1"], [3], 1) | {"SLURM_CPU_BIND_TYPE": "mask_cpu:"}
    step = read_slurm_step(environ)
    assert step.own_cpus
    role = ClusterRole.from_tf_config(render.tf_config(lay_out_step(step, LayoutPolicy()), 1))
    assert role.threads(4, own_cpus=True) == (4, 4)
    assert not read_slurm_step(environ | {"SLURM_CPU_BIND_TYPE": "none"}).own_cpus


def test_explain_shows_each_task_s_threads_from_the_node_s_cpus() -> None:
    planned = subprocess.run(
        [sys.executable, "-m", "tfconfig_slurm.commands", "--explain", "--nodelist=node[1-2]",
         "--ntasks_per_node=3", "--gpus_per_node=2", "--cpus_per_node=16"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    rows = [line.split() for line in planned.stdout.splitlines()[1:8]]
    assert rows[0][-1] == "threads"
    assert [(row[3], row[-1]) for row in rows[1:]] == [
        ("ps", "16+16"), ("chief", "8+8"), ("worker", "8+8"),
        ("ps", "16+16"), ("worker", "8+8"), ("worker", "8+8"),
    ]  # fmt: skip
    # In a job step, from SLURM's CPUs on the node.
    environ = {"PATH": os.environ["PATH"], **task_env(["node1"], [3], 0), "SLURM_CPUS_ON_NODE": "4"}
    in_step = subprocess.run(
        [sys.executable, "-m", "tfconfig_slurm.commands", "--explain"],
        env=environ, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert [line.split()[-1] for line in in_step.stdout.splitlines()[2:5]] == [
        "4+4", "2+2", "2+2"
    ]  # fmt: skip

"""Reading a task's environment, and the rank-to-node map, against real Slurm captures."""

from __future__ import annotations

import pytest

from tests.slurm_envs import captured, captured_step, task_env
from tfconfig_slurm.cluster import (
    LayoutPolicy,
    in_job_step,
    lay_out_step,
    read_slurm_step,
)
from tfconfig_slurm.cluster.layout import place_tasks
from tfconfig_slurm.errors import SlurmEnvironmentError


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("n[9-11]", ["n9", "n10", "n11"]),  # SLURM's order, not sorted() as TF's resolver
        ("n[0001-0003]", ["n0001", "n0002", "n0003"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("node[01-03,07],gpu-a[1-2]", ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]),
        ("zeta,alpha", ["zeta", "alpha"]),
    ],
)
def test_node_list_keeps_slurm_order(nodelist: str, expected: list[str]) -> None:
    environ = task_env(expected, [1] * len(expected), 0, nodelist=nodelist)
    assert read_slurm_step(environ).shape.nodes == tuple(expected)


def test_tasks_per_node_repetitions() -> None:
    nodes = [f"c{index}" for index in range(7)]
    environ = task_env(nodes, [3, 3, 2, 11, 11, 11, 11], 0, tasks_per_node_text="3(x2),2,11(x4)")
    assert read_slurm_step(environ).shape.tasks_per_node == (3, 3, 2, 11, 11, 11, 11)


def test_block_capture_every_value() -> None:
    step = read_slurm_step(captured("block_3x3_gres2", "task-4"))
    assert (step.rank, step.node_index, step.local_id, step.node_name) == (4, 1, 1, "node2")
    assert step.shape.nodes == ("node1", "node2", "node3")
    assert step.shape.tasks_per_node == (3, 3, 3)
    assert step.shape.distribution == "block"
    assert step.shape.node_gpus == ("0", "1")
    assert (step.shape.job_id, step.shape.step_id, step.shape.restart_count) == (1, 0, 0)
    assert step.shape.run_id == "1.0.0"
    assert (step.array_job_id, step.array_task_id) == (None, None)


def test_array_and_requeue_ids() -> None:
    array_task = read_slurm_step(captured("array_1_a1", "task-3"))
    assert (array_task.array_job_id, array_task.array_task_id) == (9, 1)
    requeued = read_slurm_step(captured("requeue", "after") | {"SLURM_STEP_ID": "0"})
    assert requeued.shape.restart_count == 1
    assert requeued.shape.run_id.endswith(".0.1")


@pytest.mark.parametrize(
    ("configuration", "nodes_of_ranks"),
    [
        ("block_3x3_gres2", [0, 0, 0, 1, 1, 1, 2, 2, 2]),
        ("batch_3x3_gres2", [0, 0, 0, 1, 1, 1, 2, 2, 2]),
        ("exclusive_gres_per_node", [0, 0, 0, 1, 1, 1, 2, 2, 2]),
        ("cyclic_3x3_tpn3_gres2", [0, 1, 2, 0, 1, 2, 0, 1, 2]),
        ("uneven_n10_cpu", [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]),
        ("array_1_a0", [0, 0, 1, 1]),
    ],
)
def test_every_captured_task_agrees_with_slurm(
    configuration: str, nodes_of_ranks: list[int]
) -> None:
    """Each task of a real step computes the same cluster, and its own place checks out."""
    environs = captured_step(configuration)
    layouts = [lay_out_step(read_slurm_step(environ), LayoutPolicy()) for environ in environs]
    assert all(layout.cluster() == layouts[0].cluster() for layout in layouts)
    placement = place_tasks(layouts[0].shape.tasks_per_node, layouts[0].shape.distribution)
    assert list(placement.node_indices) == nodes_of_ranks
    for environ, layout in zip(environs, layouts):
        assert layout.task(int(environ["SLURM_PROCID"])).node == environ["SLURMD_NODENAME"]


def test_cyclic_skips_full_nodes() -> None:
    """-m cyclic with tasks per node 4(x2),1 put ranks 0,3,5,7 on the first node."""
    placement = place_tasks((4, 4, 1), "cyclic")
    first_node = [rank for rank, node in enumerate(placement.node_indices) if node == 0]
    assert first_node == [0, 3, 5, 7]
    assert [placement.local_ids[rank] for rank in first_node] == [0, 1, 2, 3]


def test_batch_shell_is_not_a_step() -> None:
    batch = captured("array_1_a1", "batch")
    assert not in_job_step(batch)
    with pytest.raises(SlurmEnvironmentError) as raised:
        read_slurm_step(batch)
    assert raised.value.culprit == "SLURM_STEP_ID"
    assert "srun" in raised.value.hint


def test_job_variables_stand_in_for_missing_step_variables() -> None:
    environ = captured("block_3x3_gres2", "task-4")
    for step_only in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"):
        del environ[step_only]
    step = read_slurm_step(environ)
    assert step.shape.nodes == ("node1", "node2", "node3")
    assert step.shape.num_tasks == 9


@pytest.mark.parametrize(
    ("gpu_variables", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "2,3"}, ("2", "3")),
        ({"SLURM_STEP_GPUS": "2,3"}, ("2", "3")),
        ({"SLURM_JOB_GPUS": "5,7"}, ("5", "7")),
        # Under cgroup device constraints CUDA sees the task's own devices from 0.
        ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "4,5"}, ("0", "1")),
        ({"SLURM_GPUS_ON_NODE": "2"}, ("0", "1")),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, ()),
        ({}, ()),
        # Inherited from the submitting shell by a step that SLURM gave no GPUs.
        ({"CUDA_VISIBLE_DEVICES": "0"}, ()),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, ()),
        ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "0"}, ()),
        # Narrowed to one task's GPU by with-tfconfig: the saved value of this step (job 4242,
        # step 0) stands for SLURM's; a saved value of another step does not.
        (
            {
                "CUDA_VISIBLE_DEVICES": "3",
                "SLURM_STEP_GPUS": "2,3",
                "SLURM_GPUS_ON_NODE": "2",
                "TFCONFIG_SLURM_STEP_GPUS": "4242.0:2,3",
            },
            ("2", "3"),
        ),
        ({"TFCONFIG_SLURM_STEP_GPUS": "4242.0:"}, ()),
        ({"CUDA_VISIBLE_DEVICES": "0", "TFCONFIG_SLURM_STEP_GPUS": "4241.0:0,1"}, ()),
        (
            {
                "CUDA_VISIBLE_DEVICES": "2,3",
                "SLURM_STEP_GPUS": "2,3",
                "TFCONFIG_SLURM_STEP_GPUS": "4242.1:7",
            },
            ("2", "3"),
        ),
    ],
)
def test_gpu_ids_are_slurms(gpu_variables: dict[str, str], expected: tuple[str, ...]) -> None:
    environ = task_env(["g1"], [3], 1) | gpu_variables
    assert read_slurm_step(environ).shape.node_gpus == expected

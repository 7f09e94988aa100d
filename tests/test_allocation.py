"""A batch job's allocation, and a step's environment on the nodes a --no-kill job keeps
after one failed: srun sizes a step by these variables (cluster/step.py)."""

from __future__ import annotations

import pytest

from tests.slurm_envs import captured
from tfconfig_slurm.cluster.step import Allocation, read_job_allocation
from tfconfig_slurm.errors import SlurmEnvironmentError


def test_a_step_on_the_nodes_left_is_sized_for_them() -> None:
    """An array task's batch script of 2 nodes, 2 tasks each, which lost node1: the step's
    environment describes node2 alone; the batch script's own is left as it was."""
    batch = captured("array_1_a0", "batch")
    held = read_job_allocation(batch)
    assert held == Allocation(("node1", "node2"), (2, 2), (2, 2))
    left = held.keeping(["node2"]).step_environment(batch)
    assert {name: left[name] for name in SIZED} == {
        "SLURM_JOB_NODELIST": "node2",
        "SLURM_NODELIST": "node2",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2",
        "SLURM_JOB_CPUS_PER_NODE": "2",
        "SLURM_OVERLAP": "1",
    }
    assert left["SLURM_NTASKS_PER_NODE"] == "2" and left["SLURM_JOB_ID"] == batch["SLURM_JOB_ID"]
    assert batch["SLURM_JOB_NODELIST"] == "node[1-2]"


def test_uneven_nodes_keep_their_own_counts_in_slurm_s_order() -> None:
    """`-n 10` on 3 nodes (4, 4, 2 tasks): the node that failed takes its own tasks along."""
    environ = captured("uneven_n10_cpu", "task-0")
    held = read_job_allocation(environ)
    assert held is not None and held.tasks_per_node == (4, 4, 2)
    left = held.keeping(["node3", "node1"]).step_environment(environ)
    assert (left["SLURM_JOB_NODELIST"], left["SLURM_TASKS_PER_NODE"], left["SLURM_NTASKS"]) == (
        "node[1,3]",
        "4,2",
        "6",
    )
    assert left["SLURM_JOB_CPUS_PER_NODE"] == "4,2"


def test_a_heterogeneous_job_and_no_job_hold_no_allocation_to_read() -> None:
    """A heterogeneous job's batch script sees its first component only."""
    assert read_job_allocation(captured("het_sbatch_1cpu_2x2gres2", "batch")) is None
    assert read_job_allocation({"PATH": "/usr/bin"}) is None


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("SLURM_TASKS_PER_NODE", "2(x", "is '2(x', not a SLURM tasks-per-node list"),
        ("SLURM_JOB_CPUS_PER_NODE", "2(x3)", "is '2(x3)', 3 nodes, but SLURM_JOB_NODELIST has 2"),
        ("SLURM_JOB_NODELIST", "node[1-", "is 'node[1-', not a SLURM hostlist"),
    ],
)
def test_a_garbled_allocation_is_refused_by_name(variable: str, value: str, said: str) -> None:
    environ = {**captured("array_1_a0", "batch"), variable: value}
    with pytest.raises(SlurmEnvironmentError, match=variable) as refused:
        read_job_allocation(environ)
    assert said in str(refused.value)


SIZED = (
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NNODES",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_OVERLAP",
)


def test_a_job_that_asked_for_no_task_count_gets_none_and_its_gpus_are_shared_out() -> None:
    """Without -n, SLURM sets no SLURM_NTASKS and its tasks per node are CPUs: a count set
    would be srun's -n, one task a CPU. --gpus=a100:4 on 2 nodes is 2 a node: a100:2 on one."""
    batch = {**captured("array_1_a0", "batch"), "SLURM_GPUS": "a100:4"}
    for name in ("SLURM_NTASKS", "SLURM_NPROCS"):
        del batch[name]
    held = read_job_allocation(batch)
    assert held is not None and held.gpus == "a100:4"
    left = held.keeping(["node1"]).step_environment(batch)
    assert "SLURM_NTASKS" not in left and "SLURM_NPROCS" not in left
    assert left["SLURM_GPUS"] == "a100:2"
    # 3 GPUs on 2 nodes cannot be shared out by node: srun then asks for none by count.
    odd = read_job_allocation({**batch, "SLURM_GPUS": "3"})
    assert odd is not None and "SLURM_GPUS" not in odd.keeping(["node1"]).step_environment(batch)

"""The layout, case by case, including each thing TensorFlow's SlurmClusterResolver gets wrong."""

from __future__ import annotations

import pytest

from tests.slurm_envs import captured, captured_step, task_env
from tfconfig_slurm.cluster import (
    ClusterLayout,
    LayoutPolicy,
    lay_out_step,
    read_slurm_step,
    render,
)
from tfconfig_slurm.cluster.layout import derived_port_base
from tfconfig_slurm.cluster.render import cuda_visible_devices, tf_config
from tfconfig_slurm.cluster.role import ClusterRole, run_of
from tfconfig_slurm.errors import LayoutError, UsageError


def layout_of(environ: dict[str, str], policy: LayoutPolicy | None = None) -> ClusterLayout:
    return lay_out_step(read_slurm_step(environ), policy or LayoutPolicy())


def roles(layout: ClusterLayout) -> list[str]:
    return [f"{task.role}{task.index}" for task in layout.tasks]


def test_every_rank_s_tf_config_reads_back_as_its_task_and_writes_the_same_text() -> None:
    """One writer, one reader: a rank's TF_CONFIG as a task reads it, and as its trainer's
    server writes it again, are the layout's."""
    layout = layout_of(captured("block_3x3_gres2", "task-4"), LayoutPolicy(evaluator=True))
    for task in layout.tasks:
        config = tf_config(layout, task.rank)
        role = ClusterRole.from_tf_config(config)
        assert str(role.task_id) == f"{task.role} {task.index}"
        assert role.has_evaluator
        assert role.run_id == layout.shape.run_id
        assert role.tf_config() == config
        assert run_of(render.tf_config_json(layout, task.rank)) == layout.shape.run_id


def test_block_3x3_tf_config_exactly() -> None:
    """The captured srun -N3 --ntasks-per-node=3 --gres=gpu:2, rank 4."""
    layout = layout_of(captured("block_3x3_gres2", "task-4"))
    base = derived_port_base(1, 0, 3)
    assert tf_config(layout, 4) == {
        "cluster": {
            "chief": [f"node1:{base + 1}"],
            "ps": [f"node1:{base}", f"node2:{base}", f"node3:{base}"],
            "worker": [
                f"node1:{base + 2}",
                f"node2:{base + 1}",
                f"node2:{base + 2}",
                f"node3:{base + 1}",
                f"node3:{base + 2}",
            ],
        },
        "task": {"type": "worker", "index": 1},
        # The run it was made for: job 1, step 0, not requeued.
        "tfconfig_slurm": {"evaluator": False, "run": "1.0.0"},
    }
    # A ps beside one trainer per GPU: each trainer still gets its own GPU (TF's gives none).
    assert [cuda_visible_devices(task) for task in layout.tasks] == [
        "",
        "0",
        "1",
        "",
        "0",
        "1",
        "",
        "0",
        "1",
    ]


def test_chief_is_first_trainer_of_first_node_in_slurm_order() -> None:
    layout = layout_of(task_env(["n9", "n10", "n11"], [2, 2, 2], 0, nodelist="n[9-11]"))
    assert roles(layout) == ["ps0", "chief0", "ps1", "worker0", "ps2", "worker1"]
    assert layout.task(1).node == "n9"


def test_slurm_gpu_ids_are_kept() -> None:
    layout = layout_of(task_env(["a", "b"], [3, 3], 0, gpus="2,3"))
    assert [task.gpus for task in layout.tasks] == [(), ("2",), ("3",)] * 2


def test_each_trainer_drives_one_gpu_and_the_others_are_named_idle() -> None:
    """8 GPUs and 3 tasks a node: each trainer once got 4 GPUs and used one."""
    layout = layout_of(task_env(["a", "b"], [3, 3], 0, gpus="0,1,2,3,4,5,6,7"))
    assert [task.gpus for task in layout.tasks] == [(), ("0",), ("1",)] * 2
    assert layout.idle_gpus == {"a": ("2", "3", "4", "5", "6", "7")} | {
        "b": ("2", "3", "4", "5", "6", "7")
    }
    warning = render.idle_gpus_warning(layout)
    assert warning is not None
    assert warning.startswith("GPUs idle on 2 of 2 nodes (a: 2,3,4,5,6,7; b: 2,3,4,5,6,7)")
    assert warning.endswith("HINT: one trainer per GPU: #SBATCH --ntasks-per-node=9")
    assert "8 GPUs per node, 1 per trainer, 12 idle" in render.summary_line(layout)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_evaluator_gets_a_gpu_its_nodes_trainers_left(gpus: int) -> None:
    """#SBATCH --ntasks-per-node=<GPUs + 1> with --evaluator: the last node has one trainer
    fewer, and its GPU goes to the evaluator, on nodes of 2, 4 and 8 GPUs alike."""
    ids = ",".join(map(str, range(gpus)))
    layout = layout_of(
        task_env(["a", "b"], [gpus + 1] * 2, 0, gpus=ids), LayoutPolicy(evaluator=True)
    )
    evaluator = layout.tasks[-1]
    assert (evaluator.role, evaluator.gpus) == ("evaluator", (str(gpus - 1),))
    assert all(len(task.gpus) == 1 for task in layout.tasks if task.role in ("chief", "worker"))
    assert layout.idle_gpus == {}
    assert render.idle_gpus_warning(layout) is None
    assert "1 per trainer, 1 for the evaluator;" in render.summary_line(layout)


def test_an_evaluator_placed_first_by_roles_never_takes_a_trainers_gpu() -> None:
    roles_ = ("evaluator", "ps", "chief", "worker")
    layout = layout_of(task_env(["a"], [4], 0, gpus="0,1"), LayoutPolicy(roles=roles_))
    assert [task.gpus for task in layout.tasks] == [(), (), ("0",), ("1",)]


def test_cpu_only_step() -> None:
    """TF #56894: the resolver crashes without GPUs; here every task simply gets none."""
    layout = layout_of(captured("uneven_n10_cpu", "task-9"))
    assert all(task.gpus == () for task in layout.tasks)
    assert roles(layout) == [
        "ps0", "chief0", "worker0", "worker1",
        "ps1", "worker2", "worker3", "worker4",
        "ps2", "worker5",
    ]  # fmt: skip


def test_cyclic_distribution() -> None:
    layout = layout_of(captured("cyclic_3x3_tpn3_gres2", "task-4"))
    # node1 holds ranks 0,3,6; node2 1,4,7; node3 2,5,8: the first local task of each is ps.
    assert roles(layout) == [
        "ps0",
        "ps1",
        "ps2",
        "chief0",
        "worker0",
        "worker1",
        "worker2",
        "worker3",
        "worker4",
    ]
    assert [task.node for task in layout.tasks[:4]] == ["node1", "node2", "node3", "node1"]
    assert [task.gpus for task in layout.tasks if task.node == "node2"] == [(), ("0",), ("1",)]


def test_ps_less_cluster() -> None:
    layout = layout_of(task_env(["a", "b"], [2, 2], 0, gpus="0,1"), LayoutPolicy(ps_per_node=0))
    assert roles(layout) == ["chief0", "worker0", "worker1", "worker2"]
    assert "ps" not in layout.cluster()


def test_all_reduce_lays_out_a_chief_and_a_worker_per_gpu_and_no_parameter_server() -> None:
    """As MultiWorkerMirroredStrategy wants: 2 nodes x 4 GPUs, 4 tasks each, one GPU each."""
    environ = task_env(["a", "b"], [4, 4], 5, gpus="0,1,2,3")
    layout = layout_of(environ, LayoutPolicy(all_reduce=True))
    assert roles(layout) == ["chief0", *(f"worker{index}" for index in range(7))]
    assert [task.gpus for task in layout.tasks] == [(gpu,) for gpu in "0123"] * 2
    assert sorted(layout.cluster()) == ["chief", "worker"]
    assert tf_config(layout, 5)["task"] == {"type": "worker", "index": 4}


def test_a_coordinator_layout_gives_each_node_s_workers_its_gpus_and_the_coordinator_none() -> None:
    """As ParameterServerStrategy wants: 2 nodes x 4 GPUs, the first with 3 tasks (ps,
    coordinator, worker), the second with 3 (ps, two workers that split its GPUs)."""
    environ = task_env(["a", "b"], [3, 3], 1, gpus="0,1,2,3")
    layout = layout_of(environ, LayoutPolicy(coordinator=True))
    assert roles(layout) == ["ps0", "chief0", "worker0", "ps1", "worker1", "worker2"]
    assert [task.gpus for task in layout.tasks] == [
        (), (), ("0", "1", "2", "3"), (), ("0", "1"), ("2", "3")
    ]  # fmt: skip
    assert ClusterRole.from_tf_config(tf_config(layout, 1)).coordinator
    assert not layout.idle_gpus
    assert "1 chief (the coordinator)" in render.summary_line(layout)


def test_a_coordinator_s_evaluator_names_only_itself_and_still_knows_its_cluster() -> None:
    layout = layout_of(
        task_env(["a", "b"], [3, 3], 5), LayoutPolicy(coordinator=True, evaluator=True)
    )
    config = tf_config(layout, 5)
    assert config["cluster"] == {"evaluator": [layout.task(5).address]}
    assert config["task"] == {"type": "evaluator", "index": 0}
    role = ClusterRole.from_tf_config(config)
    assert (role.coordinator, role.has_evaluator) == (True, True)
    assert role.jobs() == layout.cluster()
    # Nobody else's cluster names the evaluator, the coordinator's least of all.
    assert "evaluator" not in tf_config(layout, 1)["cluster"]


def test_a_node_without_a_worker_beside_the_coordinator_is_named_idle() -> None:
    layout = layout_of(task_env(["a", "b"], [2, 2], 0, gpus="0,1"), LayoutPolicy(coordinator=True))
    assert roles(layout) == ["ps0", "chief0", "ps1", "worker0"]
    assert layout.idle_gpus == {"a": ("0", "1")}
    warning = render.idle_gpus_warning(layout)
    assert warning is not None and "#SBATCH --ntasks-per-node=3" in warning


def test_a_coordinator_s_evaluator_takes_a_gpu_of_a_node_without_workers() -> None:
    """As --evaluator's help says: a GPU the node's workers left free; with workers on its
    node (which share all its GPUs), none."""
    environ = task_env(["a", "b"], [3, 2], 0, gpus="0,1,2,3")
    layout = layout_of(environ, LayoutPolicy(coordinator=True, evaluator=True))
    assert roles(layout) == ["ps0", "chief0", "worker0", "ps1", "evaluator0"]
    assert [task.gpus for task in layout.tasks] == [(), (), ("0", "1", "2", "3"), (), ("0",)]
    assert layout.idle_gpus == {"b": ("1", "2", "3")}
    beside_workers = layout_of(
        task_env(["a", "b"], [3, 3], 0, gpus="0,1"), LayoutPolicy(coordinator=True, evaluator=True)
    )
    assert [task.gpus for task in beside_workers.tasks][-2:] == [("0", "1"), ()]
    assert beside_workers.idle_gpus == {}


@pytest.mark.parametrize(
    ("tasks", "gpus", "culprit"),
    [([2, 1], "0,1", "--coordinator"), ([3, 4], "0,1", "GPUs of node b")],
)
def test_a_coordinator_layout_that_cannot_be_is_refused(
    tasks: list[int], gpus: str, culprit: str
) -> None:
    with pytest.raises(LayoutError) as raised:
        layout_of(task_env(["a", "b"], tasks, 0, gpus=gpus), LayoutPolicy(coordinator=True))
    assert raised.value.culprit == culprit


def test_a_task_refuses_its_own_node_s_gpus_first() -> None:
    """Both nodes have 3 trainers for 2 GPUs: the task on node b names node b, where it runs
    (a newcomer's job said node1 for tasks that ran on node2)."""
    for rank, node in ((0, "a"), (5, "b")):
        with pytest.raises(LayoutError) as raised:
            layout_of(task_env(["a", "b"], [4, 4], rank, gpus="0,1"), LayoutPolicy())
        assert raised.value.culprit == f"GPUs of node {node}"


def test_explicit_roles_as_in_tf4slurm() -> None:
    explicit = ("ps", "worker", "worker", "worker", "ps", "worker", "worker", "worker")
    layout = layout_of(task_env(["a", "b"], [4, 4], 0), LayoutPolicy(roles=explicit))
    assert roles(layout) == [
        "ps0",
        "chief0",
        "worker0",
        "worker1",
        "ps1",
        "worker2",
        "worker3",
        "worker4",
    ]


def test_explicit_chief_and_evaluator() -> None:
    explicit = ("worker", "ps", "chief", "evaluator")
    layout = layout_of(task_env(["a", "b"], [2, 2], 0), LayoutPolicy(roles=explicit))
    assert roles(layout) == ["worker0", "ps0", "chief0", "evaluator0"]


def test_evaluator_is_last_task_outside_the_cluster() -> None:
    environ = task_env(["a", "b"], [3, 3], 5, gpus="0,1")
    layout = layout_of(environ, LayoutPolicy(evaluator=True))
    assert tf_config(layout, 5)["task"] == {"type": "evaluator", "index": 0}
    in_cluster = [address for job in layout.cluster().values() for address in job]
    assert layout.task(5).address not in in_cluster
    # Node b's one remaining trainer drives one GPU, and the evaluator takes the other.
    assert layout.task(4).gpus == ("0",)
    assert layout.task(5).gpus == ("1",)


def test_ports_differ_between_jobs_and_steps_sharing_a_node() -> None:
    """TF's resolver gives every job the same port_base."""
    bases = {derived_port_base(job, step, 9) for job in range(1000, 1100) for step in range(4)}
    assert len(bases) == 400
    assert all(base >= 10000 and base + 15 < 32768 for base in bases)


def test_steps_of_one_job_never_share_ports() -> None:
    """With step_id % 4, steps 0 and 4 of a job once got the same ports."""
    blocks = (32768 - 10000) // 16
    bases = [derived_port_base(4242, step, 9) for step in range(blocks)]
    assert len(set(bases)) == blocks == 1423


@pytest.mark.parametrize("busiest", [17, 24, 100])
def test_port_blocks_hold_busy_nodes_below_the_ephemeral_range(busiest: int) -> None:
    bases = sorted(derived_port_base(job, 0, busiest) for job in range(5000))
    assert all(base + busiest - 1 < 32768 for base in bases)
    # Consecutive jobs get blocks that do not overlap.
    first, second = derived_port_base(7, 0, busiest), derived_port_base(8, 0, busiest)
    assert abs(second - first) >= busiest


def test_port_base_may_end_exactly_at_65535() -> None:
    layout = layout_of(task_env(["a"], [3], 0), LayoutPolicy(port_base=65533))
    assert layout.task(2).address == "a:65535"
    with pytest.raises(UsageError):
        layout_of(task_env(["a"], [3], 0), LayoutPolicy(port_base=65534))


def test_distribution_with_a_binding_part_is_read_by_its_node_part() -> None:
    """cyclic:block deals ranks to nodes cyclically; the part after ':' binds within a node."""
    environ = task_env(["a", "b"], [2, 2], 1, distribution="cyclic") | {
        "SLURM_DISTRIBUTION": "cyclic:block,Pack"
    }
    assert read_slurm_step(environ).shape.distribution == "cyclic"
    assert layout_of(environ).task(1).node == "b"


def test_explicit_roles_under_cyclic_take_the_chief_from_the_first_node() -> None:
    # Cyclic over a, b: ranks 0 and 2 on a, 1 and 3 on b. Rank 1 is the first trainer by rank,
    # rank 2 the first trainer of the first node.
    environ = task_env(["a", "b"], [2, 2], 0, distribution="cyclic")
    layout = layout_of(environ, LayoutPolicy(roles=("ps", "worker", "worker", "ps")))
    assert roles(layout) == ["ps0", "worker0", "chief0", "ps1"]


def test_address_template_and_port_base() -> None:
    layout = layout_of(
        task_env(["a", "b"], [2, 2], 0),
        LayoutPolicy(address_template="{node}-ib0", port_base=2222),
    )
    assert [task.address for task in layout.tasks] == [
        "a-ib0:2222",
        "a-ib0:2223",
        "b-ib0:2222",
        "b-ib0:2223",
    ]


def test_fewer_gpus_than_trainers_name_the_fix() -> None:
    with pytest.raises(LayoutError) as raised:
        layout_of(task_env(["gpu01"], [4], 0, gpus="0,1"))
    assert raised.value.culprit == "GPUs of node gpu01"
    assert "the node has 2 GPUs (0,1) for its 3 trainers" in raised.value.problem
    assert "#SBATCH --ntasks-per-node=3" in raised.value.hint
    assert "#SBATCH --gres=gpu:3" in raised.value.hint


def test_no_trainer_is_refused() -> None:
    with pytest.raises(LayoutError) as raised:
        layout_of(task_env(["a", "b"], [1, 1], 0))
    assert raised.value.culprit == "--ps_per_node"


@pytest.mark.parametrize(
    ("policy", "culprit"),
    [
        ({"ps_per_node": -1}, "--ps_per_node"),
        ({"address_template": "{host}"}, "--address_template"),
        ({"address_template": "fixed"}, "--address_template"),
        ({"port_base": 80}, "--port_base"),
        ({"roles": ("ps", "boss")}, "--roles"),
        ({"roles": ("chief", "chief")}, "--roles"),
        ({"address_template": "{node"}, "--address_template"),
        ({"address_template": "{node!r}"}, "--address_template"),
        ({"address_template": "{node:>10}"}, "--address_template"),
        ({"address_template": "{node}:22"}, "--address_template"),
        ({"address_template": "{0}"}, "--address_template"),
        ({"address_template": "{node} ib"}, "--address_template"),
        ({"all_reduce": True, "ps_per_node": 1}, "--ps_per_node"),
        ({"all_reduce": True, "roles": ("chief", "ps")}, "--roles"),
        ({"coordinator": True, "all_reduce": True}, "--coordinator"),
        ({"coordinator": True, "ps_per_node": 0}, "--ps_per_node"),
    ],
)
def test_bad_policies(policy: dict[str, object], culprit: str) -> None:
    with pytest.raises(UsageError) as raised:
        LayoutPolicy(**policy)  # type: ignore[arg-type]
    assert raised.value.culprit == culprit


@pytest.mark.parametrize("configuration", ["het_srun_1cpu_2x2gres2", "het_sbatch_1cpu_2x2gres2"])
def test_a_heterogeneous_job_puts_its_parameter_servers_on_the_cpu_component(
    configuration: str,
) -> None:
    """srun -N1 -n1 : -N2 --ntasks-per-node=2 --gres=gpu:2, and #SBATCH hetjob + srun
    --het-group=0,1: the first component's node1 runs the ps, a trainer drives each GPU of
    node2 and node3, and no GPU is idle."""
    environs = captured_step(configuration)
    layouts = [layout_of(environ) for environ in environs]
    assert all(layout.cluster() == layouts[0].cluster() for layout in layouts)
    # Each task sees its own GPUs; the ps's task, on the CPU node, sees none.
    for environ, layout in zip(environs, layouts):
        task = layout.task(int(environ["SLURM_PROCID"]))
        assert task.node == environ["SLURMD_NODENAME"]
        assert roles(layout) == ["ps0", "chief0", "worker0", "worker1", "worker2"]
        assert task.gpus == (() if task.role == "ps" else (str(task.local_id),))
        assert layout.idle_gpus == {}


def test_a_heterogeneous_job_s_evaluator_needs_a_second_cpu_task() -> None:
    with pytest.raises(LayoutError) as raised:
        layout_of(captured("het_srun_1cpu_2x2gres2", "task-3"), LayoutPolicy(evaluator=True))
    assert raised.value.culprit == "--evaluator"
    assert "#SBATCH --ntasks=2 before hetjob" in raised.value.hint
    two_cpu_tasks = {
        **captured("het_srun_1cpu_2x2gres2", "task-4"),
        "SLURM_PROCID": "5",
        "SLURM_STEP_TASKS_PER_NODE": "2,2(x2)",
        "SLURM_STEP_NUM_TASKS": "6",
    }
    layout = layout_of(two_cpu_tasks, LayoutPolicy(evaluator=True))
    assert roles(layout) == ["ps0", "evaluator0", "chief0", "worker0", "worker1", "worker2"]
    assert [task.gpus for task in layout.tasks][:2] == [(), ()]


def test_a_step_of_one_component_of_a_heterogeneous_job_is_laid_out_as_any() -> None:
    """srun --het-group=1 alone: the step has no node of the first component."""
    gpu_only = {
        **captured("het_sbatch_1cpu_2x2gres2", "task-3"),
        "SLURM_STEP_NODELIST": "node[2-3]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_PROCID": "2",
        "SLURM_NODEID": "1",
    }
    assert roles(layout_of(gpu_only)) == ["ps0", "chief0", "ps1", "worker0"]

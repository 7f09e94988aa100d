"""process/task/place.py and the shard of a trainer: a process's place from its environment, and the
TFCONFIG_SLURM_* variables a user's script sets its layout with. SLURM faked by dictionaries."""

from __future__ import annotations

import json

import pytest

from tests.slurm_envs import task_env
from tfconfig_slurm.cluster import LayoutPolicy
from tfconfig_slurm.cluster.role import Shard, input_shard
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.task import place

NODES = ["n1", "n2"]


def test_the_variables_set_every_field_of_the_layout_policy() -> None:
    policy = place.policy_from_environ(
        {
            "TFCONFIG_SLURM_PS_PER_NODE": "2",
            "TFCONFIG_SLURM_ROLES": "ps, chief,worker",
            "TFCONFIG_SLURM_EVALUATOR": "yes",
            "TFCONFIG_SLURM_ADDRESS_TEMPLATE": "{node}-ib0",
            "TFCONFIG_SLURM_PORT_BASE": "23000",
        }
    )
    assert policy == LayoutPolicy(
        ps_per_node=2,
        roles=("ps", "chief", "worker"),
        evaluator=True,
        address_template="{node}-ib0",
        port_base=23000,
    )
    assert place.policy_from_environ({}) == LayoutPolicy()
    all_reduce = place.policy_from_environ({"TFCONFIG_SLURM_ALL_REDUCE": "1"})
    assert all_reduce == LayoutPolicy(all_reduce=True)
    assert all_reduce.servers_per_node == 0


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("TFCONFIG_SLURM_PS_PER_NODE", "one", "expected a whole number"),
        ("TFCONFIG_SLURM_PS_PER_NODE", "-1", "expected 0 or more"),
        ("TFCONFIG_SLURM_EVALUATOR", "maybe", "expected 1, true or yes, or 0"),
        ("TFCONFIG_SLURM_ROLES", "ps,boss", "'boss'"),
        ("TFCONFIG_SLURM_PORT_BASE", "80", "expected a port"),
        ("TFCONFIG_SLURM_ALL_REDUCE", "maybe", "expected 1, true or yes, or 0"),
    ],
)
def test_a_bad_variable_is_named_in_the_error(variable: str, value: str, problem: str) -> None:
    with pytest.raises(UsageError) as raised:
        place.policy_from_environ({variable: value})
    assert raised.value.culprit == variable
    assert problem in raised.value.problem
    # An example in the hint is the variable's, not the flag's this process lacks.
    assert "--" not in raised.value.hint, raised.value.hint


@pytest.mark.parametrize("variable", ["TFCONFIG_SLURM_PS_PER_NODE", "TFCONFIG_SLURM_PORT_BASE"])
def test_a_variable_s_hint_gives_a_value_it_accepts(variable: str) -> None:
    with pytest.raises(UsageError) as raised:
        place.policy_from_environ({variable: "many"})
    example = raised.value.hint.removeprefix(f"e.g. {variable}=")
    place.policy_from_environ({variable: example})


def test_outside_a_step_a_process_trains_alone_and_drops_a_tf_config_it_was_not_given() -> None:
    where = place.find({"SLURM_JOB_ID": "7"}, LayoutPolicy(), "--ps_per_node")
    assert where.role is None
    assert where.layout_source == "--ps_per_node"
    # A step of one task, with a TF_CONFIG the submitting shell left: set aside, and unset.
    inherited = {"cluster": {"chief": ["elsewhere:2222"]}, "task": {"type": "chief", "index": 0}}
    environ = {**task_env(["n1"], [1], 0), "TF_CONFIG": json.dumps(inherited)}
    alone = place.find(environ, LayoutPolicy(), "--ps_per_node")
    assert alone.role is None
    assert "TF_CONFIG" in environ
    alone.set_in(environ)
    assert "TF_CONFIG" not in environ


def test_in_a_step_the_task_takes_its_role_and_the_door_sets_its_environment() -> None:
    environ = task_env(NODES, [2, 2], 3, gpus="0")
    before = dict(environ)
    where = place.find(environ, LayoutPolicy(), "--ps_per_node")
    assert where.role is not None
    assert (where.role.role, where.role.index, where.node) == ("worker", 0, "n2")
    # Finding the place changes nothing: the door sets the task's variables.
    assert environ == before
    where.set_in(environ)
    assert json.loads(environ["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert environ["CUDA_VISIBLE_DEVICES"] == where.gpus
    # The same environment again: the TF_CONFIG now set is this step's, and is taken as given.
    again = place.find(environ, LayoutPolicy(ps_per_node=0), "--ps_per_node")
    assert again.role == where.role
    assert again.layout_source == "TF_CONFIG"


def test_a_resolver_s_environment_keeps_no_tf_config_made_for_it_but_one_given() -> None:
    environ = task_env(NODES, [2, 2], 3, gpus="0")
    place.find(environ, LayoutPolicy(), "--ps_per_node").set_in(environ, tf_config=False)
    assert "TF_CONFIG" not in environ
    assert environ["CUDA_VISIBLE_DEVICES"] == "0"
    given = place.find(task_env(NODES, [2, 2], 3, gpus="0"), LayoutPolicy(), "--ps_per_node")
    given.set_in(environ)
    place.find(environ, LayoutPolicy(), "--ps_per_node").set_in(environ, tf_config=False)
    assert environ["TF_CONFIG"] == given.environment["TF_CONFIG"]


def test_a_single_task_step_trains_alone() -> None:
    where = place.find(task_env(["n1"], [1], 0), LayoutPolicy(), "--ps_per_node")
    assert where.role is None


@pytest.mark.parametrize(
    ("rank", "shard"),
    [(0, Shard(1, 0)), (1, Shard(2, 0)), (2, Shard(1, 0)), (3, Shard(2, 1))],
)
def test_trainer_i_of_n_reads_shard_i_and_the_rest_read_everything(rank: int, shard: Shard) -> None:
    environ = task_env(NODES, [2, 2], rank)
    place.find(environ, LayoutPolicy(), "--ps_per_node").set_in(environ)
    assert input_shard(environ) == shard


def test_a_process_without_tf_config_reads_everything() -> None:
    assert input_shard({}) == Shard(num_shards=1, shard_index=0)


def test_all_reduce_with_parameter_servers_names_the_variable_that_asked_for_them() -> None:
    with pytest.raises(UsageError) as raised:
        place.policy_from_environ(
            {"TFCONFIG_SLURM_ALL_REDUCE": "1", "TFCONFIG_SLURM_PS_PER_NODE": "1"}
        )
    assert raised.value.culprit == "TFCONFIG_SLURM_PS_PER_NODE"
    assert "--all_reduce lays a step out without parameter servers" in raised.value.problem

"""The layout flags every command shares, and the one way to turn them into a layout.

Inside a job step the layout comes from SLURM's variables; with `--nodelist` it is planned from
flags, so a user sees it before submitting. `tfconfig-slurm` and `with-tfconfig` resolve a
task's layout through `resolve_layout`; the training runtime takes `step_policy` to
runtime/place.py, which lays the step out the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from absl import flags

from tfconfig_slurm.cluster import (
    ClusterLayout,
    LayoutPolicy,
    StepShape,
    expand_nodes,
    lay_out,
    read_slurm_step,
)
from tfconfig_slurm.cluster.step import DISTRIBUTIONS, check_task_count
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.runtime import place

PS_PER_NODE = flags.DEFINE_integer(
    "ps_per_node",
    None,
    "Parameter servers on each node: the first N tasks of every node. Default: 1, or 0 with "
    "--all_reduce. 0 gives a cluster of chief and workers only.",
)
ALL_REDUCE = flags.DEFINE_boolean(
    "all_reduce",
    LayoutPolicy.all_reduce,
    "Lay the step out for all-reduce training, as tf.distribute.MultiWorkerMirroredStrategy "
    "wants: a chief and workers, one per GPU, and no parameter servers (a parameter server "
    "in its cluster makes every task fail or hang).",
)
ROLES = flags.DEFINE_list(
    "roles",
    None,
    "One role per rank, in rank order, overriding --ps_per_node and --evaluator: chief, "
    "worker, ps or evaluator, e.g. ps,worker,worker,worker,ps,worker,worker,worker. Without a "
    "chief, the first trainer of the first node becomes chief.",
)
EVALUATOR = flags.DEFINE_boolean(
    "evaluator",
    LayoutPolicy.evaluator,
    "Make the step's last task the evaluator: it is not in the cluster, takes a GPU its "
    "node's trainers left free (or none), and "
    "evaluates each new checkpoint.",
)
ADDRESS_TEMPLATE = flags.DEFINE_string(
    "address_template",
    LayoutPolicy.address_template,
    "How a node's name becomes the address other tasks reach it at, e.g. '{node}-ib0' for "
    "an InfiniBand interface.",
)
PORT_BASE = flags.DEFINE_integer(
    "port_base",
    LayoutPolicy.port_base,
    "Port of each node's first task; task N of a node listens on base + N. Default: derived "
    "from the job and step ids, so jobs and steps sharing a node do not collide.",
)
NODELIST = flags.DEFINE_string(
    "nodelist",
    None,
    "Plan a layout without SLURM, for --explain: the nodes as a SLURM hostlist, e.g. 'gpu[01-04]'.",
)
NTASKS_PER_NODE = flags.DEFINE_integer(
    "ntasks_per_node",
    None,
    "With --nodelist: tasks on each node, as #SBATCH --ntasks-per-node. Default: one trainer "
    "per GPU plus --ps_per_node, or one trainer plus --ps_per_node without GPUs.",
)
GPUS_PER_NODE = flags.DEFINE_integer(
    "gpus_per_node", 0, "With --nodelist: GPUs on each node, as #SBATCH --gres=gpu:N."
)
DISTRIBUTION = flags.DEFINE_enum(
    "distribution",
    "block",
    DISTRIBUTIONS,
    "With --nodelist: how ranks are dealt to nodes, as srun -m.",
)

_PLAN_FLAGS = ("ntasks_per_node", "gpus_per_node", "distribution")
# Far beyond any node's GPUs; a bound keeps a typo from building a huge plan.
MAX_GPUS_PER_NODE = 1024


class ResolvedLayout(NamedTuple):
    """A layout and this task's rank in it; rank is None for a layout planned from flags."""

    layout: ClusterLayout
    rank: int | None


def policy_from_flags() -> LayoutPolicy:
    if ROLES.present and not ROLES.value:
        raise UsageError("--roles", "is empty", "give one role per rank, or leave --roles out")
    return LayoutPolicy(
        ps_per_node=PS_PER_NODE.value,
        all_reduce=ALL_REDUCE.value,
        roles=tuple(ROLES.value) if ROLES.value else None,
        evaluator=EVALUATOR.value,
        address_template=ADDRESS_TEMPLATE.value,
        port_base=PORT_BASE.value,
    )


def resolve_layout(environ: Mapping[str, str]) -> ResolvedLayout:
    """This task's layout from SLURM's variables, or a planned one when --nodelist is given."""
    if NODELIST.value is not None:
        policy = policy_from_flags()
        return ResolvedLayout(lay_out(planned_shape(policy), policy), None)
    step = read_slurm_step(environ)
    return ResolvedLayout(place.step_layout(step, step_policy()), step.rank)


def step_policy() -> LayoutPolicy:
    """The policy for laying out the job step this runs in: the planning flags are refused."""
    given = [f"--{name}" for name in ("nodelist", *_PLAN_FLAGS) if flags.FLAGS[name].present]
    if given:
        raise UsageError(
            given[0],
            "describes a planned step (tfconfig-slurm --explain --nodelist=...), not this one",
            "inside a job step SLURM says how many tasks and GPUs there are: leave it out; to "
            "plan a step, tfconfig-slurm --explain --nodelist='gpu[01-04]'",
        )
    return policy_from_flags()


def planned_shape(policy: LayoutPolicy) -> StepShape:
    """The shape of the step the planning flags describe."""
    nodes = expand_nodes(
        "--nodelist", NODELIST.value or "", UsageError, "e.g. --nodelist='gpu[01-04]'"
    )
    gpus = GPUS_PER_NODE.value
    if not 0 <= gpus <= MAX_GPUS_PER_NODE:
        raise UsageError(
            "--gpus_per_node", f"is {gpus}, expected 0 to {MAX_GPUS_PER_NODE}", "e.g. 4"
        )
    tasks = NTASKS_PER_NODE.value
    if tasks is None:
        tasks = policy.servers_per_node + max(gpus, 1)
    if tasks < 1:
        raise UsageError(
            "--ntasks_per_node", f"is {tasks}, expected 1 or more", "e.g. GPUs per node + 1"
        )
    tasks_per_node = (tasks,) * len(nodes)
    check_task_count("--ntasks_per_node", tasks_per_node, UsageError, "plan a smaller step")
    return StepShape(
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        distribution=DISTRIBUTION.value,
        node_gpus=tuple(str(gpu) for gpu in range(gpus)),
        job_id=0,
        step_id=0,
    )

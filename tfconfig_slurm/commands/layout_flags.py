"""The layout flags every command shares, and the one way to turn them into a layout.

Inside a job step the layout comes from SLURM's variables; with `--nodelist` it is planned from
flags (plan_flags.py). The runtime takes `step_policy` to process/task/place.py instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from absl import flags

from tfconfig_slurm.cluster import (
    ClusterLayout,
    LayoutPolicy,
    in_job_step,
    lay_out,
    lay_out_step,
    read_slurm_step,
)
from tfconfig_slurm.commands import plan_flags
from tfconfig_slurm.errors import LayoutError, UsageError

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
COORDINATOR = flags.DEFINE_boolean(
    "coordinator",
    LayoutPolicy.coordinator,
    "Lay the step out for tf.distribute.ParameterServerStrategy: the chief (the first "
    "trainer of the first node) is the coordinator, which trains nothing and takes no GPU; "
    "each node's parameter servers, then its workers, which share the node's GPUs (one "
    "worker a node takes them all). The evaluator's TF_CONFIG names only itself.",
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
_PLAN_FLAGS = (
    "ntasks_per_node",
    "gpus_per_node",
    "distribution",
    "cpu_nodelist",
    "cpu_ntasks_per_node",
)
# Every layout flag but --coordinator, which a process that trains alone refuses.
LAYOUT_FLAGS = ("ps_per_node", "all_reduce", "roles", "evaluator", "address_template", "port_base")


def policy_from_flags() -> LayoutPolicy:
    if ROLES.present and not ROLES.value:
        raise UsageError("--roles", "is empty", "give one role per rank, or leave --roles out")
    return LayoutPolicy(
        ps_per_node=PS_PER_NODE.value,
        all_reduce=ALL_REDUCE.value,
        coordinator=COORDINATOR.value,
        roles=tuple(ROLES.value) if ROLES.value else None,
        evaluator=EVALUATOR.value,
        address_template=ADDRESS_TEMPLATE.value,
        port_base=PORT_BASE.value,
    )


def as_planned(text: str) -> str:
    """The core's hints, which name #SBATCH lines, as the planning flags that set the same."""
    planned = text.replace("#SBATCH --ntasks-per-node=", "--ntasks_per_node=")
    return planned.replace("#SBATCH --gres=gpu:", "--gpus_per_node=")


def resolve_layout(environ: Mapping[str, str]) -> tuple[ClusterLayout, int | None]:
    """This task's layout from SLURM's variables and its rank in it, or a planned one when
    --nodelist is given, and no rank."""
    if plan_flags.NODELIST.value is not None:
        policy = policy_from_flags()
        try:
            return lay_out(plan_flags.planned_shape(policy), policy), None
        except LayoutError as error:
            # Too few tasks for the parameter servers, where the user chose the tasks and
            # left the servers at their default: the count given is the one to change.
            chosen = plan_flags.NTASKS_PER_NODE.present and not PS_PER_NODE.present
            culprit = "--ntasks_per_node" if error.culprit == "--ps_per_node" and chosen else None
            raise LayoutError(
                culprit or error.culprit, error.problem, as_planned(error.hint)
            ) from None
    planning = [f"--{name}" for name in _PLAN_FLAGS if flags.FLAGS[name].present]
    if planning and not in_job_step(environ):
        raise UsageError(
            planning[0],
            "plans a step, whose nodes --nodelist names, and it is missing",
            f"add it: tfconfig-slurm --explain --nodelist='gpu[01-04]' {planning[0]}=...",
        )
    # The flags first: flags that go together in no step are refused in any.
    policy = step_policy()
    step = read_slurm_step(environ)
    return lay_out_step(step, policy), step.rank


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

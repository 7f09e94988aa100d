"""The flags that describe a step to plan, for `tfconfig-slurm --explain --nodelist=...`: a
layout seen before submitting. Defined for every command, so that the others can refuse them
by name (layout_flags.step_policy), but listed only in tfconfig-slurm's help."""

from __future__ import annotations

from absl import flags

from tfconfig_slurm.cluster import LayoutPolicy, StepShape
from tfconfig_slurm.cluster.step import DISTRIBUTIONS, MAX_TASKS, check_task_count, expand_nodes
from tfconfig_slurm.errors import UsageError

NODELIST = flags.DEFINE_string(
    "nodelist",
    None,
    "Plan a layout without SLURM, for --explain: the nodes as a SLURM hostlist, e.g. 'gpu[01-04]'.",
)
NTASKS_PER_NODE = flags.DEFINE_integer(
    "ntasks_per_node",
    None,
    "With --nodelist: tasks on each node, as #SBATCH --ntasks-per-node. Default: one trainer "
    "per GPU plus --ps_per_node, or one trainer plus --ps_per_node without GPUs; with "
    "--coordinator, one worker plus --ps_per_node, and the coordinator besides on the first "
    "node.",
)
GPUS_PER_NODE = flags.DEFINE_integer(
    "gpus_per_node", 0, "With --nodelist: GPUs on each node, as #SBATCH --gres=gpu:N."
)
CPUS_PER_NODE = flags.DEFINE_integer(
    "cpus_per_node",
    None,
    "With --nodelist: CPUs the job has on each node (SLURM_CPUS_ON_NODE), to show the "
    "threads each task's TensorFlow is given for its role and its node's share of them.",
    lower_bound=1,
)
CPU_NODELIST = flags.DEFINE_string(
    "cpu_nodelist",
    None,
    "With --nodelist: plan a heterogeneous job (#SBATCH hetjob, srun's ':') whose first "
    "component is these CPU nodes, which run the parameter servers (and the evaluator) "
    "while the --nodelist nodes train, e.g. --cpu_nodelist=cpu01.",
)
CPU_NTASKS_PER_NODE = flags.DEFINE_integer(
    "cpu_ntasks_per_node", 1, "With --cpu_nodelist: tasks on each CPU node, all parameter servers."
)
DISTRIBUTION = flags.DEFINE_enum(
    "distribution",
    "block",
    DISTRIBUTIONS,
    "With --nodelist: how ranks are dealt to nodes, as srun -m.",
)

# Far beyond any node's GPUs; a bound keeps a typo from building a huge plan.
MAX_GPUS_PER_NODE = 1024


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
    cpu_nodes = _cpu_nodes()
    tasks = NTASKS_PER_NODE.value
    # A coordinator's first node runs it beside that node's worker, one task more.
    first_extra = 0
    if tasks is None:
        servers = (policy.ps_per_node or 0) if cpu_nodes else policy.servers_per_node
        # One trainer a GPU; a coordinator's workers take a node's GPUs together.
        tasks = servers + (1 if policy.coordinator else max(gpus, 1))
        first_extra = int(policy.coordinator)
    if CPU_NTASKS_PER_NODE.present and not cpu_nodes:
        raise UsageError(
            "--cpu_ntasks_per_node",
            "goes with --cpu_nodelist, the CPU nodes it counts the tasks of",
            "add --cpu_nodelist=cpu01, or leave it out",
        )
    for flag, count, hint in (
        ("--ntasks_per_node", tasks, "e.g. GPUs per node + 1"),
        ("--cpu_ntasks_per_node", CPU_NTASKS_PER_NODE.value, "e.g. 1: each is a parameter server"),
    ):
        if count < 1:
            raise UsageError(flag, f"is {count}, expected 1 or more", hint)
    tasks_per_node = (
        (CPU_NTASKS_PER_NODE.value,) * len(cpu_nodes)
        + (tasks + first_extra,)
        + (tasks,) * (len(nodes) - 1)
    )
    check_task_count(
        _count_culprit(policy, nodes, cpu_nodes), tasks_per_node, UsageError, "plan a smaller step"
    )
    if set(cpu_nodes) & set(nodes):
        raise UsageError(
            "--cpu_nodelist",
            f"names {sorted(set(cpu_nodes) & set(nodes))[0]}, which --nodelist names too",
            "a heterogeneous job's components run on nodes of their own",
        )
    return StepShape(
        nodes=cpu_nodes + nodes,
        tasks_per_node=tasks_per_node,
        distribution=DISTRIBUTION.value,
        node_gpus=tuple(str(gpu) for gpu in range(gpus)),
        job_id=0,
        step_id=0,
        server_nodes=tuple(range(len(cpu_nodes))),
        cpus_on_node=CPUS_PER_NODE.value,
    )


def _count_culprit(policy: LayoutPolicy, nodes: tuple[str, ...], cpu_nodes: tuple[str, ...]) -> str:
    """The flag a step of too many tasks is named for: the one that made the count."""
    if CPU_NTASKS_PER_NODE.value * len(cpu_nodes) > MAX_TASKS:
        return "--cpu_ntasks_per_node"
    if NTASKS_PER_NODE.value is not None:
        return "--ntasks_per_node"
    if (policy.ps_per_node or 0) * len(nodes) > MAX_TASKS:
        return "--ps_per_node"
    return "--nodelist"


def _cpu_nodes() -> tuple[str, ...]:
    if CPU_NODELIST.value is None:
        return ()
    return expand_nodes(
        "--cpu_nodelist", CPU_NODELIST.value, UsageError, "e.g. --cpu_nodelist='cpu[01-02]'"
    )

"""Reading a SLURM task's environment into a `SlurmStep`: who this task is, and the step's shape;
and a batch job's into its `Allocation`, and back for a step on the nodes it keeps.

Pure: takes an environment mapping, never `os.environ` implicitly, and gives a new one; hostlists
and tasks-per-node strings go through python-hostlist, in SLURM's order. Where a node of a
`--no-kill` job fails, the batch script's variables still describe every node, and srun refuses a
step they size ("SLURM_JOB_NUM_NODES environment variable conflicts with allocated node count").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

import hostlist

from tfconfig_slurm.errors import SlurmEnvironmentError, TfconfigSlurmError

BLOCK = "block"
CYCLIC = "cyclic"
DISTRIBUTIONS = (BLOCK, CYCLIC)

CONTINUATION = "TFCONFIG_SLURM_CONTINUATION"

# Where each value comes from; the first variable set wins. The step's own come before the
# job's: a step may run on part of its job's allocation. CUDA_VISIBLE_DEVICES leads the GPU
# sources: under cgroup device constraints SLURM numbers it as the task sees its devices, while
# SLURM_STEP_GPUS keeps the node's numbering. It counts only where SLURM allocated GPUs
# ("gpus_allocated"): one inherited from the submitting shell describes some other machine.
SOURCES: Mapping[str, tuple[str, ...]] = {
    "rank": ("SLURM_PROCID",),
    "node_index": ("SLURM_NODEID",),
    "local_id": ("SLURM_LOCALID",),
    "node_name": ("SLURMD_NODENAME",),
    "nodelist": ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
    "num_tasks": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    # The batch job's allocation, as its batch script sees it (Allocation).
    "job_nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "job_tasks_per_node": ("SLURM_TASKS_PER_NODE",),
    "job_cpus_per_node": ("SLURM_JOB_CPUS_PER_NODE",),
    "job_gpus": ("SLURM_GPUS",),
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "array_task_id": ("SLURM_ARRAY_TASK_ID",),
    "restart_count": ("SLURM_RESTART_COUNT",),
    # Not SLURM's: the jobs this run went on from (process/job/continuation.py).
    "continuation": (CONTINUATION,),
    "distribution": ("SLURM_DISTRIBUTION",),
    # The job's CPUs on the node, and how SLURM bound this task to them (cluster/role.py).
    "cpus_on_node": ("SLURM_CPUS_ON_NODE",),
    "cpu_bind_type": ("SLURM_CPU_BIND_TYPE",),
    "gpus": ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
    "gpus_allocated": ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"),
    # A heterogeneous job's components (sbatch's `#SBATCH hetjob`, srun's `:`); srun of
    # Slurm 22.05 names them PACK in a step it made itself.
    "het_size": ("SLURM_HET_SIZE", "SLURM_PACK_SIZE"),
    "first_component_nodelist": (
        "SLURM_JOB_NODELIST_HET_GROUP_0",
        "SLURM_JOB_NODELIST_PACK_GROUP_0",
    ),
}
# The node's GPUs as SLURM gave them to a step, `<job>.<step>:<ids>`, saved where a task's
# CUDA_VISIBLE_DEVICES is narrowed (render.task_environment), for a command run under it; it
# counts only in the step it names.
STEP_GPUS = "TFCONFIG_SLURM_STEP_GPUS"

_RUN_IN_SRUN = "SLURM sets it in every task of a job step: run this inside srun"
_IN_BATCH_JOB = "SLURM sets it in a batch job's script: run this there"
# SLURM's ids and counts are 32-bit; a longer number is garbage.
MAX_WHOLE_NUMBER = 2**32 - 1
# More tasks than any TensorFlow cluster has: a larger step is refused before it is laid out.
MAX_TASKS = 2**20
# SLURM's value for a GPU request on a node whose gres has no device files.
_NO_DEVICES = "NoDevFiles"


@dataclass(frozen=True)
class StepShape:
    """The picture of a whole job step that every one of its tasks computes alike."""

    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    distribution: str
    # One node's GPU ids, SLURM's own (never renumbered); every node of a step gets as many.
    node_gpus: tuple[str, ...]
    job_id: int
    step_id: int
    # How often SLURM requeued the job, which keeps its id and numbers its steps from 0 again.
    restart_count: int = 0
    # In a heterogeneous step, the (CPU) nodes of the first component, by index: node_gpus
    # are then the others'. Empty for any other step.
    server_nodes: tuple[int, ...] = ()
    # The CPUs the job has on each node, where known.
    cpus_on_node: int | None = None

    @property
    def num_tasks(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def run_id(self) -> str:
        """This attempt at this step, `<job>.<step>.<restart count>`: what a TF_CONFIG made for
        it carries, so that one inherited from elsewhere is told apart."""
        return f"{self.job_id}.{self.step_id}.{self.restart_count}"


@dataclass(frozen=True)
class SlurmStep:
    """One task of a job step: the step's shape and this task's place in it, as SLURM says."""

    shape: StepShape
    rank: int
    node_index: int
    local_id: int
    node_name: str | None
    array_job_id: int | None
    array_task_id: int | None
    # Whether SLURM bound this task to CPUs of its own (--cpu-bind other than none).
    own_cpus: bool = False


@dataclass(frozen=True)
class SlurmJob:
    """The SLURM job a process runs in, in a batch script as in a job step's task."""

    job_id: int
    array_job_id: int | None
    array_task_id: int | None
    restart_count: int
    # The jobs this run went on from (continuation.py).
    continuation: int = 0

    @property
    def name(self) -> str:
        """How scontrol and squeue name it: `<array job>_<task>` for an array task."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


def read_slurm_job(environ: Mapping[str, str]) -> SlurmJob | None:
    """The job this process runs in, or None outside SLURM; SlurmEnvironmentError if garbled."""
    if _lookup(environ, "job_id") is None:
        return None
    return SlurmJob(
        job_id=_whole_number(environ, "job_id"),
        array_job_id=_optional_whole_number(environ, "array_job_id"),
        array_task_id=_optional_whole_number(environ, "array_task_id"),
        restart_count=_optional_whole_number(environ, "restart_count") or 0,
        continuation=_optional_whole_number(environ, "continuation") or 0,
    )


@dataclass(frozen=True)
class Allocation:
    """What a batch job holds, node by node in SLURM's order; a count is None where unknown."""

    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] | None
    cpus_per_node: tuple[int, ...] | None
    # The job's GPUs in all (sbatch --gpus=[type:]N, SLURM_GPUS), which srun asks for again.
    gpus: str | None = None

    def keeping(self, nodes: Sequence[str]) -> Allocation:
        """This allocation on those of its nodes in `nodes`, in its own order."""
        kept = [index for index, node in enumerate(self.nodes) if node in set(nodes)]
        return replace(
            self,
            nodes=tuple(self.nodes[index] for index in kept),
            tasks_per_node=_kept(self.tasks_per_node, kept),
            cpus_per_node=_kept(self.cpus_per_node, kept),
            gpus=_scaled(self.gpus, len(kept), len(self.nodes)),
        )

    def step_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """`environ` (a batch script's), its allocation variables describing this one."""
        nodes = hostlist.collect_hostlist(list(self.nodes))
        built = dict(environ)
        built.update(
            SLURM_JOB_NODELIST=nodes,
            SLURM_NODELIST=nodes,
            SLURM_JOB_NUM_NODES=str(len(self.nodes)),
            SLURM_NNODES=str(len(self.nodes)),
            # srun --overlap: Slurm 22.05 may never complete the failed step, which then holds
            # the CPUs of the nodes left, and a step without it waits "Requested nodes are busy".
            SLURM_OVERLAP="1",
        )
        if self.tasks_per_node is not None:
            built["SLURM_TASKS_PER_NODE"] = _counts(self.tasks_per_node)
            # srun takes them for -n; SLURM sets them only for a job that asked for a count of
            # tasks (otherwise its tasks per node are its CPUs per node).
            for name in ("SLURM_NTASKS", "SLURM_NPROCS"):
                if name in environ:
                    built[name] = str(sum(self.tasks_per_node))
        if self.cpus_per_node is not None:
            built["SLURM_JOB_CPUS_PER_NODE"] = _counts(self.cpus_per_node)
        built.pop("SLURM_GPUS", None)
        if self.gpus is not None:
            built["SLURM_GPUS"] = self.gpus
        return built


def _kept(counts: tuple[int, ...] | None, kept: list[int]) -> tuple[int, ...] | None:
    return None if counts is None else tuple(counts[index] for index in kept)


def _scaled(gpus: str | None, kept: int, nodes: int) -> str | None:
    """A job's GPUs in all (`a100:8`), for `kept` of its `nodes` nodes; None where they cannot
    be shared out evenly (srun then asks for none by count)."""
    if gpus is None:
        return None
    kind, _, count = gpus.rpartition(":")
    if not count.isdigit() or int(count) * kept % nodes:
        return None
    return f"{kind}:{int(count) * kept // nodes}" if kind else str(int(count) * kept // nodes)


def _counts(counts: tuple[int, ...]) -> str:
    """SLURM's form of a count per node: `3(x2),2`."""
    runs = [(count, len(list(same))) for count, same in groupby(counts)]
    return ",".join(f"{count}(x{times})" if times > 1 else str(count) for count, times in runs)


def read_job_allocation(environ: Mapping[str, str]) -> Allocation | None:
    """What the batch job holds, as its batch script sees it; None outside a job, and in a
    heterogeneous job, whose batch script sees only its first component."""
    found = _lookup(environ, "job_nodelist")
    if found is None or _lookup(environ, "het_size") is not None:
        return None
    nodes = expand_nodes(*found, SlurmEnvironmentError, _IN_BATCH_JOB)
    gpus = _lookup(environ, "job_gpus")
    return Allocation(
        nodes,
        _counts_per_node(environ, "job_tasks_per_node", len(nodes)),
        _counts_per_node(environ, "job_cpus_per_node", len(nodes)),
        gpus[1] if gpus else None,
    )


def in_job_step(environ: Mapping[str, str]) -> bool:
    """True inside a task of a job step (srun), false in a batch shell or outside SLURM."""
    return _lookup(environ, "step_id") is not None and "SLURM_PROCID" in environ


def read_slurm_step(environ: Mapping[str, str]) -> SlurmStep:
    """This task's `SlurmStep`; SlurmEnvironmentError names a variable that is wrong."""
    _check_in_a_step(environ)
    nodes = expand_nodes(*_required(environ, "nodelist"), SlurmEnvironmentError, _RUN_IN_SRUN)
    tasks_per_node = _tasks_per_node(environ)
    if len(tasks_per_node) != len(nodes):
        raise SlurmEnvironmentError(
            _name(environ, "tasks_per_node"),
            f"lists {len(tasks_per_node)} nodes but {_name(environ, 'nodelist')} has "
            f"{len(nodes)} ({', '.join(nodes[:4])}{', ...' if len(nodes) > 4 else ''})",
            "these come from the same srun and must agree; do not set them by hand",
        )
    num_tasks = _whole_number(environ, "num_tasks", minimum=1)
    if num_tasks != sum(tasks_per_node):
        raise SlurmEnvironmentError(
            _name(environ, "num_tasks"),
            f"says {num_tasks} tasks but {_name(environ, 'tasks_per_node')} adds up to "
            f"{sum(tasks_per_node)}",
            "these come from the same srun and must agree; do not set them by hand",
        )
    rank = _whole_number(environ, "rank")
    if rank >= num_tasks:
        raise SlurmEnvironmentError(
            "SLURM_PROCID",
            f"is {rank}, out of range for a step of {num_tasks} tasks (0 to {num_tasks - 1})",
            _RUN_IN_SRUN,
        )
    node_index = _whole_number(environ, "node_index")
    if node_index >= len(nodes):
        raise SlurmEnvironmentError(
            "SLURM_NODEID",
            f"is {node_index}, out of range for a step on {len(nodes)} nodes",
            _RUN_IN_SRUN,
        )
    node_name = _lookup(environ, "node_name")
    job_and_step = _whole_number(environ, "job_id"), _whole_number(environ, "step_id")
    return SlurmStep(
        shape=StepShape(
            nodes=nodes,
            tasks_per_node=tasks_per_node,
            distribution=_distribution(environ),
            node_gpus=_node_gpus(environ, *job_and_step),
            job_id=job_and_step[0],
            step_id=job_and_step[1],
            restart_count=_optional_whole_number(environ, "restart_count") or 0,
            server_nodes=_first_component_nodes(environ, nodes),
            cpus_on_node=_optional_whole_number(environ, "cpus_on_node"),
        ),
        rank=rank,
        node_index=node_index,
        local_id=_whole_number(environ, "local_id"),
        node_name=node_name[1] if node_name else None,
        array_job_id=_optional_whole_number(environ, "array_job_id"),
        array_task_id=_optional_whole_number(environ, "array_task_id"),
        own_cpus=_bound(environ),
    )


def _check_in_a_step(environ: Mapping[str, str]) -> None:
    """Refuses an environment that is no SLURM job's, or a job's batch script's."""
    job_id = _lookup(environ, "job_id")
    if job_id is None:
        raise SlurmEnvironmentError(
            "SLURM_JOB_ID",
            "not set, so this is not running inside a SLURM job",
            "run this command in every task of a job step: put srun before it (in a batch "
            "script or an salloc); to see a layout before submitting: tfconfig-slurm --explain "
            "--nodelist='gpu[01-04]'",
        )
    if _lookup(environ, "step_id") is None:
        raise SlurmEnvironmentError(
            "SLURM_STEP_ID",
            f"not set: this is the batch script of job {job_id[1]}, not a task of a job step",
            "launch one task per process: put srun before this command in the batch script",
        )


def _bound(environ: Mapping[str, str]) -> bool:
    """Whether SLURM bound this task to CPUs of its own (by core, thread or rank, not by socket
    or locality domain, which several tasks share)."""
    _, kinds = _lookup(environ, "cpu_bind_type") or ("", "")
    return any(
        kind in kinds.lower() for kind in ("cores", "threads", "rank", "map_cpu", "mask_cpu")
    )


def _lookup(environ: Mapping[str, str], field: str) -> tuple[str, str] | None:
    """The (variable, value) of the first source of `field` that is set."""
    for variable in SOURCES[field]:
        if (value := environ.get(variable)) is not None:
            return variable, value
    return None


def _name(environ: Mapping[str, str], field: str) -> str:
    return (_lookup(environ, field) or SOURCES[field])[0]


def _required(environ: Mapping[str, str], field: str) -> tuple[str, str]:
    if (found := _lookup(environ, field)) is None:
        raise SlurmEnvironmentError(" or ".join(SOURCES[field]), "not set", _RUN_IN_SRUN)
    return found


def _whole_number(environ: Mapping[str, str], field: str, minimum: int = 0) -> int:
    variable, value = _required(environ, field)
    text = value.strip()
    if (
        not text.isdigit()
        or not text.isascii()
        or len(text) > len(str(MAX_WHOLE_NUMBER))
        or not minimum <= int(text) <= MAX_WHOLE_NUMBER
    ):
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}, expected a whole number from {minimum} to {MAX_WHOLE_NUMBER}",
            _RUN_IN_SRUN,
        )
    return int(text)


def _optional_whole_number(environ: Mapping[str, str], field: str) -> int | None:
    return None if _lookup(environ, field) is None else _whole_number(environ, field)


def _tasks_per_node(environ: Mapping[str, str]) -> tuple[int, ...]:
    variable, value = _required(environ, "tasks_per_node")
    counts = _parse_counts(variable, value, _RUN_IN_SRUN)
    if any(count < 1 for count in counts):
        raise SlurmEnvironmentError(
            variable, f"is {value!r}: every node of a step runs at least one task", _RUN_IN_SRUN
        )
    check_task_count(variable, counts, SlurmEnvironmentError, _RUN_IN_SRUN)
    return counts


def _counts_per_node(environ: Mapping[str, str], field: str, nodes: int) -> tuple[int, ...] | None:
    """A batch job's count per node (`3(x2),2`), None where it is not set."""
    if (found := _lookup(environ, field)) is None:
        return None
    counts = _parse_counts(*found, _IN_BATCH_JOB)
    if len(counts) != nodes:
        raise SlurmEnvironmentError(
            found[0],
            f"is {found[1]!r}, {len(counts)} nodes, but {_name(environ, 'job_nodelist')} has "
            f"{nodes}",
            "SLURM sets both for the same job; do not set them by hand",
        )
    return counts


def _parse_counts(variable: str, value: str, hint: str) -> tuple[int, ...]:
    try:
        return tuple(hostlist.parse_slurm_tasks_per_node(value))
    except (hostlist.BadHostlist, ValueError) as error:
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}, not a SLURM tasks-per-node list ({error})",
            "expected a form such as 3(x2),2; " + hint,
        ) from None


def check_task_count(
    culprit: str, tasks_per_node: tuple[int, ...], error: type[TfconfigSlurmError], hint: str
) -> None:
    """Refuses a step too large to lay out before any work is spent on it."""
    if sum(tasks_per_node) > MAX_TASKS:
        raise error(
            culprit,
            f"adds up to {sum(tasks_per_node)} tasks, more than the {MAX_TASKS} "
            "tfconfig-slurm lays out",
            hint,
        )


def expand_nodes(
    culprit: str, value: str, error: type[TfconfigSlurmError], hint: str
) -> tuple[str, ...]:
    """The node names of a SLURM hostlist, in SLURM's order; `culprit` names where it came from."""
    try:
        # allow_duplicates: a node named twice is an error to report, not to drop silently.
        nodes = tuple(hostlist.expand_hostlist(value, allow_duplicates=True))
    except hostlist.BadHostlist as bad:
        raise error(
            culprit,
            f"is {value!r}, not a SLURM hostlist ({bad})",
            "expected a form such as node[01-04],gpu7; " + hint,
        ) from None
    if not nodes or "" in nodes:
        raise error(culprit, f"is {value!r}, which names no node", hint)
    if any(character.isspace() for character in "".join(nodes)):
        raise error(culprit, f"is {value!r}: node names cannot hold spaces", hint)
    if len(set(nodes)) != len(nodes):
        repeated = next(node for node in nodes if nodes.count(node) > 1)
        raise error(culprit, f"names node {repeated} more than once", hint)
    return nodes


def _first_component_nodes(environ: Mapping[str, str], nodes: tuple[str, ...]) -> tuple[int, ...]:
    """The step's `StepShape.server_nodes`."""
    size = _optional_whole_number(environ, "het_size")
    found = _lookup(environ, "first_component_nodelist")
    if size is None or size < 2 or found is None:
        return ()
    first = set(expand_nodes(*found, SlurmEnvironmentError, _RUN_IN_SRUN))
    servers = tuple(index for index, node in enumerate(nodes) if node in first)
    return servers if len(servers) < len(nodes) else ()


def _distribution(environ: Mapping[str, str]) -> str:
    variable, value = _lookup(environ, "distribution") or ("", "")
    # "cyclic:block,Pack": only the part before ':' deals tasks to nodes.
    across_nodes = value.split(":")[0].split(",")[0].strip().lower()
    if across_nodes in ("", "*"):
        return BLOCK
    if across_nodes not in DISTRIBUTIONS:
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}; tasks can be laid out only for block or cyclic distribution",
            "launch with srun -m block (SLURM's default) or srun -m cyclic",
        )
    return across_nodes


def _node_gpus(environ: Mapping[str, str], job_id: int, step_id: int) -> tuple[str, ...]:
    saved, _, ids = environ.get(STEP_GPUS, "").partition(":")
    if saved == f"{job_id}.{step_id}":
        return tuple(filter(None, ids.split(",")))
    found = _lookup(environ, "gpus")
    on_node = _optional_whole_number(environ, "gpus_on_node")
    if _lookup(environ, "gpus_allocated") is None or on_node == 0:
        return ()
    if found is None:
        # SLURM said how many but not which: its devices are then numbered from 0.
        return tuple(str(gpu) for gpu in range(on_node or 0))
    variable, value = found
    if not value.strip() and on_node:
        raise SlurmEnvironmentError(
            variable,
            f"is empty, which hides this task from the {on_node} GPUs SLURM gave its node "
            f"(SLURM_GPUS_ON_NODE={on_node})",
            "run tfconfig-slurm before anything that sets CUDA_VISIBLE_DEVICES, with SLURM's value",
        )
    if value.strip() in ("", _NO_DEVICES):
        return ()
    gpus = tuple(gpu.strip() for gpu in value.split(","))
    if any(not gpu for gpu in gpus) or len(set(gpus)) != len(gpus):
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}, expected distinct GPU ids separated by commas, e.g. 0,1",
            "SLURM sets it for a step that asks for GPUs (--gres=gpu:N); do not edit it by hand",
        )
    if on_node is not None and len(gpus) < on_node:
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}: this task sees {len(gpus)} of its node's {on_node} GPUs "
            f"(SLURM_GPUS_ON_NODE={on_node}), so SLURM bound GPUs to each task "
            "(--gpus-per-task), where the layout gives each task of a node its GPUs itself, "
            "from the node's",
            f"ask for GPUs per node and let the layout share them: #SBATCH --gres=gpu:{on_node} "
            "without --gpus-per-task",
        )
    if on_node is not None and len(gpus) > on_node:
        raise SlurmEnvironmentError(
            variable,
            f"is {value!r}: {len(gpus)} GPUs, but SLURM gave this task's node {on_node} "
            f"(SLURM_GPUS_ON_NODE={on_node})",
            "leave CUDA_VISIBLE_DEVICES as SLURM set it; ask for more GPUs with "
            "#SBATCH --gres=gpu:N",
        )
    return gpus

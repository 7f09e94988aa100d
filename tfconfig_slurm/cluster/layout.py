"""The layout: which rank is chief, ps, worker or evaluator, its address, port and GPUs.

Pure and deterministic: the same `StepShape` and `LayoutPolicy` give every task the same
`ClusterLayout`. By default each node's first `ps_per_node` tasks are parameter servers and the
others trainers, one GPU each; the chief is the first node's first trainer, and an evaluator
takes a GPU the trainers left. In a heterogeneous step the first component's (CPU) nodes run
only parameter servers (and the evaluator). With `coordinator` (ParameterServerStrategy) the
chief trains nothing and takes no GPU, and a node's workers share all its GPUs.
"""

from __future__ import annotations

import functools
import itertools
import operator
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from tfconfig_slurm.cluster.step import BLOCK, CYCLIC, SlurmStep, StepShape
from tfconfig_slurm.errors import LayoutError, SlurmEnvironmentError, UsageError

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
ROLES = (CHIEF, WORKER, PS, EVALUATOR)
# The order of the jobs in a TF_CONFIG cluster; the evaluator is never part of the cluster.
CLUSTER_JOBS = (CHIEF, PS, WORKER)
# The roles that train: an all-reduce cluster has only these.
TRAINERS = (CHIEF, WORKER)

MIN_PORT = 1024
MAX_PORT = 65535
# Derived port bases stay below Linux's default ephemeral range (32768-60999), where the
# kernel picks ports for outgoing connections, and above the common services' ports.
_DERIVED_PORT_FLOOR = 10000
_DERIVED_PORT_CEILING = 32768
# Each (job, step) gets its own block of ports (a power of two wide); a job's steps take
# consecutive blocks, and consecutive job ids start _STEPS_PER_JOB blocks apart. Step k + 4 of
# a job and step k of the next can still collide; a task finds its port in use and says so.
_MIN_PORTS_PER_STEP = 16
_STEPS_PER_JOB = 4


@dataclass(frozen=True)
class LayoutPolicy:
    """How to turn a step's tasks into a TensorFlow cluster; each field is a command-line flag."""

    # None: 1, or 0 with all_reduce (see servers_per_node).
    ps_per_node: int | None = None
    # One role per rank (chief, worker, ps, evaluator); overrides ps_per_node and evaluator.
    roles: tuple[str, ...] | None = None
    evaluator: bool = False
    address_template: str = "{node}"
    port_base: int | None = None
    # The layout tf.distribute.MultiWorkerMirroredStrategy wants: no parameter servers.
    all_reduce: bool = False
    # The layout tf.distribute.ParameterServerStrategy wants (see the module's docstring).
    coordinator: bool = False

    def __post_init__(self) -> None:
        if self.ps_per_node is not None and self.ps_per_node < 0:
            raise UsageError(
                "--ps_per_node",
                f"is {self.ps_per_node}, expected 0 or more",
                "use 1 for one parameter server per node, 0 for none",
            )
        if self.all_reduce and self.servers_per_node:
            raise UsageError(
                "--ps_per_node",
                f"is {self.ps_per_node}, and --all_reduce lays a step out without parameter "
                "servers",
                "leave --ps_per_node out with --all_reduce",
            )
        if self.all_reduce and self.roles and PS in self.roles:
            raise UsageError(
                "--roles",
                "names a ps, and --all_reduce lays a step out without parameter servers",
                "give only chief, worker and evaluator roles with --all_reduce",
            )
        if self.coordinator and self.all_reduce:
            raise UsageError(
                "--coordinator",
                "lays a step out for ParameterServerStrategy, and --all_reduce for "
                "MultiWorkerMirroredStrategy",
                "give one of them",
            )
        if self.coordinator and self.ps_per_node == 0:
            raise UsageError(
                "--ps_per_node",
                "is 0, and --coordinator lays a step out for ParameterServerStrategy, which "
                "keeps its variables on parameter servers",
                "leave --ps_per_node out (one a node), or give 1 or more",
            )
        _check_address_template(self.address_template)
        if self.port_base is not None and not MIN_PORT <= self.port_base <= MAX_PORT:
            raise UsageError(
                "--port_base",
                f"is {self.port_base}, expected a port from {MIN_PORT} to {MAX_PORT}",
                "leave it unset to derive a base from the job and step ids",
            )
        if self.roles is not None:
            if unknown := sorted({role for role in self.roles if role not in ROLES}):
                raise UsageError(
                    "--roles",
                    f"has {', '.join(map(repr, unknown))}, expected only {', '.join(ROLES)}",
                    "give one role per rank, e.g. --roles=ps,worker,worker,ps,worker,worker",
                )
            for single in (CHIEF, EVALUATOR):
                if self.roles.count(single) > 1:
                    raise UsageError(
                        "--roles",
                        f"names {self.roles.count(single)} {single}s, expected at most one",
                        f"name one {single}; the other trainers are workers",
                    )

    @property
    def servers_per_node(self) -> int:
        """The parameter servers each node runs (unless roles name each task's role)."""
        return (0 if self.all_reduce else 1) if self.ps_per_node is None else self.ps_per_node


def _check_address_template(template: str) -> None:
    """Only plain {node} fields: an address is a host name, without a port or spaces."""
    bad = UsageError(
        "--address_template",
        f"is {template!r}, expected a host name pattern with {{node}}, e.g. '{{node}}-ib0', "
        "without conversions, format specs, ':' or spaces",
        "e.g. --address_template='{node}-ib0' for an InfiniBand interface's name",
    )
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        raise bad from None
    fields = [(name, spec, conversion) for _, name, spec, conversion in parts if name is not None]
    literal = "".join(text for text, _, _, _ in parts)
    if (
        not fields
        or any(field != ("node", "", None) for field in fields)
        or ":" in literal
        or any(character.isspace() for character in literal)
    ):
        raise bad


@dataclass(frozen=True)
class Placement:
    """Where every rank runs, as columns by rank (a step can have tens of thousands): its
    node's index in the step's node list, and its local id on that node."""

    node_indices: tuple[int, ...]
    local_ids: tuple[int, ...]

    def per_node(self, roles: Sequence[str], kinds: Sequence[str]) -> Counter[int]:
        """How many ranks whose `roles` are of these `kinds` each node runs, by node index."""
        return Counter(itertools.compress(self.node_indices, map(kinds.__contains__, roles)))


def place_tasks(tasks_per_node: tuple[int, ...], distribution: str) -> Placement:
    """The place of every rank of the step, as SLURM deals tasks to nodes (block or cyclic).
    Every task computes the whole map, then checks its own entry (lay_out_step), so a task
    never builds a cluster that the others do not share."""
    if distribution == BLOCK:
        # itertools rather than a loop per rank, for large steps.
        chain = itertools.chain.from_iterable
        return Placement(
            tuple(chain(map(itertools.repeat, itertools.count(), tasks_per_node))),
            tuple(chain(map(range, tasks_per_node))),
        )
    if distribution == CYCLIC:
        # Round robin over the nodes, skipping a node once it holds its share: with tasks
        # per node 4(x2),1 SLURM puts ranks 0,3,5,7 on the first node.
        dealt = [
            (node, local)
            for local in range(max(tasks_per_node))
            for node, count in enumerate(tasks_per_node)
            if local < count
        ]
        return Placement(tuple(node for node, _ in dealt), tuple(local for _, local in dealt))
    raise ValueError(f"unknown distribution {distribution!r}")


@dataclass(frozen=True)
class Task:
    """One task of the cluster: its rank, where it runs, its role, address and GPUs."""

    rank: int
    node: str
    local_id: int
    role: str
    index: int
    address: str
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class ClusterLayout:
    """Every task of a step, as columns by rank (a step can have tens of thousands of tasks,
    and one task's TF_CONFIG needs only the addresses); `task(rank)` and `tasks` build `Task`
    values, and the GPU column is worked out on first use."""

    shape: StepShape
    placement: Placement
    port_base: int
    roles: tuple[str, ...]
    indices: tuple[int, ...]
    addresses: tuple[str, ...]
    # Laid out for ParameterServerStrategy: the chief coordinates (LayoutPolicy.coordinator).
    coordinator: bool = False

    @functools.cached_property
    def gpus(self) -> tuple[tuple[str, ...], ...]:
        """Each rank's GPUs, as the module's docstring says; with a coordinator, a node's
        workers share its GPUs in equal runs, and an evaluator has one only where none works."""
        if not self.shape.node_gpus:
            return ((),) * len(self.roles)
        by_node: dict[int, list[int]] = {}
        for rank, node in enumerate(self.placement.node_indices):
            by_node.setdefault(node, []).append(rank)
        given: dict[int, tuple[str, ...]] = {}
        for node, ranks in by_node.items():
            given.update(self._node_gpus(node, ranks))
        return tuple(given.get(rank, ()) for rank in range(len(self.roles)))

    def _node_gpus(self, node: int, ranks: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """The GPUs of the ranks of one node (all of them, in rank order) that get any."""
        node_gpus = self.shape.node_gpus
        if node in self.shape.server_nodes:
            return {}
        workers = [rank for rank in ranks if self.roles[rank] == WORKER]
        if self.coordinator and workers:
            share = len(node_gpus) // len(workers)
            return {
                rank: node_gpus[nth * share : (nth + 1) * share] for nth, rank in enumerate(workers)
            }
        # Trainers first, so that an evaluator placed anywhere by --roles never takes a
        # trainer's GPU (with a coordinator, none: no worker is on this node).
        trains = trainer_roles(self.coordinator)
        takers = [rank for rank in ranks if self.roles[rank] in trains]
        takers += [rank for rank in ranks if self.roles[rank] == EVALUATOR]
        return {rank: (gpu,) for rank, gpu in zip(takers, node_gpus)}

    @property
    def idle_gpus(self) -> dict[str, tuple[str, ...]]:
        """The GPUs no task of a node uses, by node name, for the nodes that have any; counted by
        node, as every task of a step warns of them."""
        node_gpus = self.shape.node_gpus
        if not node_gpus:
            return {}
        users = self.placement.per_node(self.roles, (*trainer_roles(self.coordinator), EVALUATOR))
        workers = self.placement.per_node(self.roles, (WORKER,))
        servers = set(self.shape.server_nodes)
        # With a coordinator, a node's workers share all its GPUs.
        return {
            name: node_gpus[users[node] :]
            for node, name in enumerate(self.shape.nodes)
            if node_gpus[users[node] :]
            and node not in servers
            and not (self.coordinator and workers[node])
        }

    @property
    def reporting_rank(self) -> int:
        """The one task of a step that prints its table: the first rank off a heterogeneous
        step's first component (whose tasks see no GPUs), else rank 0."""
        servers = self.shape.server_nodes
        return next(
            rank for rank, node in enumerate(self.placement.node_indices) if node not in servers
        )

    def task(self, rank: int) -> Task:
        """One rank's task, its GPUs from its node's ranks alone: the whole column of a large step
        costs tens of milliseconds."""
        if "gpus" in self.__dict__ or not self.shape.node_gpus:
            return self._task(rank, self.gpus[rank])
        node = self.placement.node_indices[rank]
        ranks = itertools.compress(itertools.count(), map(node.__eq__, self.placement.node_indices))
        return self._task(rank, self._node_gpus(node, list(ranks)).get(rank, ()))

    @property
    def tasks(self) -> tuple[Task, ...]:
        # Every rank's GPUs at once: rank by rank would be quadratic.
        return tuple(map(self._task, range(len(self.roles)), self.gpus))

    def _task(self, rank: int, gpus: tuple[str, ...]) -> Task:
        return Task(
            rank=rank,
            node=self.shape.nodes[self.placement.node_indices[rank]],
            local_id=self.placement.local_ids[rank],
            role=self.roles[rank],
            index=self.indices[rank],
            address=self.addresses[rank],
            gpus=gpus,
        )

    def cluster(self) -> dict[str, list[str]]:
        """The TF_CONFIG cluster: addresses by job, in index order (which is rank order)."""
        jobs = {
            job: list(itertools.compress(self.addresses, [role == job for role in self.roles]))
            for job in CLUSTER_JOBS
        }
        return {job: addresses for job, addresses in jobs.items() if addresses}


def counted(count: int, noun: str) -> str:
    """A count with its noun, for a message: 1 task, 2 tasks."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def derived_port_base(job_id: int, step_id: int, tasks_on_busiest_node: int) -> int:
    """The port base of a (job, step), its block as the comment on _STEPS_PER_JOB says."""
    width = max(_MIN_PORTS_PER_STEP, 1 << (tasks_on_busiest_node - 1).bit_length())
    blocks = (_DERIVED_PORT_CEILING - _DERIVED_PORT_FLOOR) // width
    # More tasks on a node than the range holds (no block): they start at the floor, run past it.
    block = (job_id * _STEPS_PER_JOB + step_id) % max(blocks, 1)
    return _DERIVED_PORT_FLOOR + block * width


def lay_out(shape: StepShape, policy: LayoutPolicy) -> ClusterLayout:
    """The `ClusterLayout` of a step. Raises LayoutError when the tasks cannot be laid out."""
    return _lay_out(shape, place_tasks(shape.tasks_per_node, shape.distribution), policy)


def lay_out_step(step: SlurmStep, policy: LayoutPolicy) -> ClusterLayout:
    """The layout of this task's step, after checking that SLURM placed this task as computed:
    a task that disagrees fails loudly, as its cluster would not be the others'."""
    placement = place_tasks(step.shape.tasks_per_node, step.shape.distribution)
    node_index = placement.node_indices[step.rank]
    local_id = placement.local_ids[step.rank]
    node = step.shape.nodes[node_index]
    for variable, said, computed, should in (
        ("SLURMD_NODENAME", step.node_name, node, f"run on {node}"),
        ("SLURM_NODEID", step.node_index, node_index, f"run on node {node_index} ({node})"),
        ("SLURM_LOCALID", step.local_id, local_id, f"be local task {local_id} on {node}"),
    ):
        # A node name SLURM did not give is not checked.
        if said not in (None, computed):
            raise SlurmEnvironmentError(
                variable,
                f"is {said!r}, but rank {step.rank} should {should}",
                f"SLURM placed rank {step.rank} differently from {step.shape.distribution} "
                "distribution over the step's node list; launch with srun -m block or -m "
                "cyclic and do not set SLURM_* variables by hand",
            )
    return _lay_out(step.shape, placement, policy, own_node=step.node_index)


def _lay_out(
    shape: StepShape, placement: Placement, policy: LayoutPolicy, own_node: int | None = None
) -> ClusterLayout:
    kinds = _roles(shape, placement, policy)
    kinds[_choose_chief(placement, kinds, policy)] = CHIEF
    if policy.coordinator and WORKER not in kinds:
        raise LayoutError(
            "--coordinator",
            f"leaves no worker among the step's {counted(len(kinds), 'task')}: the first trainer "
            "became the coordinator, which trains nothing",
            "start one task more on the first node, e.g. sbatch --ntasks=<N + 1> (block "
            "distribution puts it there)",
        )
    _check_gpus_fit(shape, placement, kinds, policy, own_node)
    busiest = max(shape.tasks_per_node)
    # A port base given is one of MIN_PORT to MAX_PORT, never 0.
    port_base = policy.port_base or derived_port_base(shape.job_id, shape.step_id, busiest)
    if port_base + busiest - 1 > MAX_PORT:
        raise UsageError(
            "--port_base",
            f"is {port_base}, so the {busiest} tasks of a node would need ports up to "
            f"{port_base + busiest - 1}, past {MAX_PORT}",
            f"choose a base of at most {MAX_PORT - busiest + 1}",
        )
    hosts = [policy.address_template.format(node=node) for node in shape.nodes]
    ports = [f":{port_base + local}" for local in range(busiest)]
    counters = {role: itertools.count() for role in ROLES}
    return ClusterLayout(
        shape=shape,
        placement=placement,
        coordinator=policy.coordinator,
        port_base=port_base,
        roles=tuple(kinds),
        # Each rank's index within its role (C-level maps: every task lays out every rank).
        indices=tuple(map(next, map(counters.__getitem__, kinds))),
        addresses=tuple(
            map(
                operator.add,
                map(hosts.__getitem__, placement.node_indices),
                map(ports.__getitem__, placement.local_ids),
            )
        ),
    )


def _roles(shape: StepShape, placement: Placement, policy: LayoutPolicy) -> list[str]:
    """Each rank's role: as --roles names them, else ps, worker or evaluator as the module's
    docstring says (the chief is chosen later)."""
    if policy.roles:
        if len(policy.roles) != len(placement.local_ids):
            raise UsageError(
                "--roles",
                f"lists {counted(len(policy.roles), 'role')} for a step of "
                f"{counted(len(placement.local_ids), 'task')}",
                "give exactly one role per rank, in rank order",
            )
        return list(policy.roles)
    if not shape.server_nodes or policy.all_reduce:
        servers = min(policy.servers_per_node, max(shape.tasks_per_node))
        by_local_id = [PS] * servers + [WORKER] * (max(shape.tasks_per_node) - servers)
        kinds = list(map(by_local_id.__getitem__, placement.local_ids))
        if policy.evaluator:
            kinds[-1] = EVALUATOR
        return kinds
    cpu_nodes = set(shape.server_nodes)
    elsewhere = policy.ps_per_node or 0
    kinds = [
        PS if node in cpu_nodes or local < elsewhere else WORKER
        for node, local in zip(placement.node_indices, placement.local_ids)
    ]
    if policy.evaluator:
        on_servers = [rank for rank, node in enumerate(placement.node_indices) if node in cpu_nodes]
        if len(on_servers) < 2:
            raise LayoutError(
                "--evaluator",
                "asks for an evaluator beside the parameter servers, and the heterogeneous "
                f"job's first component runs {counted(len(on_servers), 'task')} in this step",
                "give the first component one task more: #SBATCH --ntasks=2 before hetjob",
            )
        kinds[on_servers[-1]] = EVALUATOR
    return kinds


def _choose_chief(placement: Placement, kinds: list[str], policy: LayoutPolicy) -> int:
    """The chief's rank: the one named so, else the first trainer of the first node."""
    if CHIEF in kinds:
        return kinds.index(CHIEF)
    if WORKER not in kinds:
        raise LayoutError(
            "--roles"
            if policy.roles
            else "--ps_per_node" + (" and --evaluator" if policy.evaluator else ""),
            f"leaves no trainer among the step's {counted(len(kinds), 'task')}, only parameter "
            "servers" + (" and an evaluator" if EVALUATOR in kinds else ""),
            "start more tasks per node than parameter servers (and one more for an "
            "evaluator), e.g. one per GPU plus one: #SBATCH --ntasks-per-node=<GPUs per node + 1>",
        )
    return min(
        itertools.compress(
            zip(placement.node_indices, placement.local_ids, range(len(kinds))),
            map(WORKER.__eq__, kinds),
        )
    )[2]


def trainer_roles(coordinator: bool) -> tuple[str, ...]:
    """The roles that train: ParameterServerStrategy's coordinator (its chief) trains nothing."""
    return (WORKER,) if coordinator else TRAINERS


def _check_gpus_fit(
    shape: StepShape,
    placement: Placement,
    roles: Sequence[str],
    policy: LayoutPolicy,
    own_node: int | None,
) -> None:
    """Every trainer of a node must have a GPU of its own (with a coordinator, a share). A task
    knows only its own node's GPUs, so that node is looked at first: its log names its own."""
    if not shape.node_gpus:
        return
    have = len(shape.node_gpus)
    trainers_per_node = placement.per_node(roles, trainer_roles(policy.coordinator)).items()
    for node, trainers in sorted(trainers_per_node, key=lambda item: (item[0] != own_node, item)):
        others = shape.tasks_per_node[node] - trainers
        if trainers > have:
            raise LayoutError(
                f"GPUs of node {shape.nodes[node]}",
                f"the node has {have} GPUs ({','.join(shape.node_gpus)}) for its {trainers} "
                f"trainers ({shape.tasks_per_node[node]} tasks, {others} of them ps or "
                "evaluator), and each trainer drives a GPU of its own",
                "change --roles so that no node has more trainers than GPUs"
                if policy.roles is not None
                else f"one trainer per GPU: #SBATCH --ntasks-per-node={have + others}; or "
                f"#SBATCH --gres=gpu:{trainers}",
            )
        if policy.coordinator and have % trainers:
            raise LayoutError(
                f"GPUs of node {shape.nodes[node]}",
                f"are {have} for its {trainers} workers, which share them in equal runs",
                "one worker a node takes all its GPUs: #SBATCH --ntasks-per-node=<ps + 1>",
            )

"""A task's place in a TensorFlow cluster: its TF_CONFIG (the one place that writes a TF_CONFIG
and reads one back), and the TensorFlow thread pools its role takes. No TensorFlow needed.

TensorFlow sizes a process's pools to every CPU it may run on, so two trainers on a node each
think they own every core. The trainers share the node's CPUs out (inside an op and between
ops alike); a parameter server, an evaluator and ParameterServerStrategy's coordinator keep
every CPU: a ps's ops run while trainers wait for them (held to 1 thread, it slowed training:
bench/RESULTS.md, "threads"), and an evaluator's final metrics would be slow on one. CPUs
SLURM bound to a task are its alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER, ClusterLayout, trainer_roles
from tfconfig_slurm.errors import UsageError

# The package's own key in a TF_CONFIG (RunConfig and TensorFlow's resolvers ignore it): what
# the cluster spec cannot say (whether there is an evaluator, the run it was made for).
RUNTIME_KEY = "tfconfig_slurm"
RUN = "run"
COORDINATOR = "coordinator"
# Where a coordinator's evaluator finds the cluster: its own TF_CONFIG names only itself, as
# ParameterServerStrategy wants (an evaluator in the coordinator's cluster hangs it).
CLUSTER = "cluster"
# The start of a --local_cluster's run id.
LOCAL_RUN_PREFIX = "local-"
_HINT = (
    'expected {"cluster": {"chief": [...], "ps": [...], "worker": [...]}, '
    '"task": {"type": ..., "index": ...}}; unset TF_CONFIG to let tfconfig-slurm compute it'
)
# The fewest threads between ops of a ParameterServerStrategy worker: one held by the
# coordinator's request for a step, one at least to run the step's ops.
PS_WORKER_MIN_INTER_OP = 2


@dataclass(frozen=True)
class TaskId:
    """A task by its role and index, named as every log line and report names it: `ps 0`."""

    role: str
    index: int

    def __str__(self) -> str:
        return f"{self.role} {self.index}"


def write(
    cluster: Mapping[str, list[str]],
    role: str,
    index: int,
    *,
    has_evaluator: bool,
    run_id: str | None,
    coordinator: bool = False,
    evaluator_address: str = "-",
) -> dict[str, Any]:
    """A TF_CONFIG, in the form `tf.estimator.RunConfig` and TensorFlow's resolvers read (a
    coordinator's evaluator at `evaluator_address`, see CLUSTER)."""
    runtime: dict[str, Any] = {EVALUATOR: has_evaluator, RUN: run_id}
    if coordinator:
        runtime[COORDINATOR] = True
        if role == EVALUATOR:
            runtime[CLUSTER] = cluster
            cluster = {EVALUATOR: [evaluator_address]}
    return {"cluster": cluster, "task": {"type": role, "index": index}, RUNTIME_KEY: runtime}


def run_of(text: str) -> str | None:
    """The run a TF_CONFIG was made for by this package; None for any other text."""
    try:
        config = json.loads(text)
    except ValueError:
        return None
    runtime = config.get(RUNTIME_KEY) if isinstance(config, dict) else None
    run = runtime.get(RUN) if isinstance(runtime, dict) else None
    return None if run is None else str(run)


class Threads(NamedTuple):
    """A task's TensorFlow thread pools: threads inside one op, and ops run at once."""

    intra_op: int
    inter_op: int

    def __str__(self) -> str:
        return f"{self.intra_op}+{self.inter_op}"


def sized_threads(
    role: str, *, cpus: int, trainers_on_node: int, coordinator: bool = False
) -> Threads:
    """The threads of a task of `role` on `cpus` CPUs that the node's `trainers_on_node`
    trainers share (1 where the task's CPUs are its own)."""
    cpus = max(1, cpus)
    if role in trainer_roles(coordinator):
        share = max(1, cpus // max(1, trainers_on_node))
        if coordinator:
            # A ParameterServerStrategy worker's handler for a step waits on its inter-op pool
            # for the step's ops, run on the same pool: with 1 thread, a step whose ops leave
            # it (its input not ready) waits for ever (#55 item 5).
            return Threads(share, max(share, PS_WORKER_MIN_INTER_OP))
        return Threads(share, share)
    if role in (PS, CHIEF, EVALUATOR):
        return Threads(cpus, cpus)
    raise ValueError(f"no threads for a task of role {role!r}")


def layout_threads(layout: ClusterLayout, cpus: int | None) -> list[Threads]:
    """Every task's threads, by rank, where each node's tasks share its `cpus` CPUs; none where
    they are unknown (outside a job, without --cpus_per_node)."""
    if not cpus:
        return []
    on_node = layout.placement.per_node(layout.roles, trainer_roles(layout.coordinator))
    return [
        sized_threads(
            role, cpus=cpus, trainers_on_node=on_node[node], coordinator=layout.coordinator
        )
        for role, node in zip(layout.roles, layout.placement.node_indices)
    ]


@dataclass(frozen=True)
class ClusterRole:
    """A task's role and index, and the cluster it belongs to."""

    cluster: Mapping[str, tuple[str, ...]]
    role: str
    index: int
    # Whether an evaluator task runs beside the cluster: then it evaluates, not the chief.
    has_evaluator: bool = False
    # One run of the cluster (StepShape.run_id, a --local_cluster's); None in a TF_CONFIG made
    # elsewhere. Reports carry it, so that the chief never takes an earlier run's.
    run_id: str | None = None
    # Laid out for ParameterServerStrategy: the chief coordinates, the workers only serve.
    coordinator: bool = False

    @classmethod
    def from_tf_config(cls, tf_config: Mapping[str, Any]) -> ClusterRole:
        if not isinstance(tf_config, Mapping):
            raise UsageError("TF_CONFIG", "is not a JSON object (a cluster and a task)", _HINT)
        runtime = tf_config.get(RUNTIME_KEY) or {}
        if not isinstance(runtime, Mapping):
            raise UsageError("TF_CONFIG", f"has a {RUNTIME_KEY!r} that is not an object", _HINT)
        try:
            jobs = runtime.get(CLUSTER) or tf_config["cluster"]
            cluster = {job: tuple(tasks) for job, tasks in jobs.items() if job != EVALUATOR}
            role, index = tf_config["task"]["type"], int(tf_config["task"]["index"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError("TF_CONFIG", "is not a cluster and a task", _HINT) from None
        for job, tasks in jobs.items():
            if not isinstance(tasks, (list, tuple)) or any(not isinstance(t, str) for t in tasks):
                raise UsageError(
                    "TF_CONFIG",
                    f"gives its cluster's {job!r} as {tasks!r}, not a list of addresses",
                    _HINT,
                )
        if role not in (CHIEF, WORKER, PS, EVALUATOR):
            raise UsageError("TF_CONFIG", f"gives the task type {role!r}", _HINT)
        if role != EVALUATOR and not 0 <= index < len(cluster.get(role, ())):
            raise UsageError("TF_CONFIG", f"names {role} {index}, which its cluster lacks", _HINT)
        if len(cluster.get(CHIEF, ())) != 1:
            raise UsageError("TF_CONFIG", "needs exactly one chief in its cluster", _HINT)
        run_id = runtime.get(RUN)
        return cls(
            cluster=cluster,
            role=role,
            index=index,
            has_evaluator=role == EVALUATOR or bool(runtime.get(EVALUATOR, False)),
            run_id=None if run_id is None else str(run_id),
            coordinator=bool(runtime.get(COORDINATOR, False)),
        )

    @classmethod
    def from_json(cls, text: str) -> ClusterRole:
        try:
            return cls.from_tf_config(json.loads(text))
        except json.JSONDecodeError as error:
            raise UsageError("TF_CONFIG", f"is not JSON ({error.msg})", _HINT) from None

    @property
    def trainers(self) -> int:
        return len(self.cluster.get(CHIEF, ())) + len(self.cluster.get(WORKER, ()))

    @property
    def workers(self) -> int:
        return len(self.cluster.get(WORKER, ()))

    @property
    def ps_count(self) -> int:
        return len(self.cluster.get(PS, ()))

    @property
    def trainer_id(self) -> int:
        """0 for the chief, 1 + index for a worker: the token it hands the ps when done."""
        return 0 if self.role == CHIEF else self.index + 1

    @property
    def task_id(self) -> TaskId:
        return TaskId(self.role, self.index)

    @property
    def in_local_cluster(self) -> bool:
        """Whether a --local_cluster launcher started this task (and speaks for it)."""
        return (self.run_id or "").startswith(LOCAL_RUN_PREFIX)

    @property
    def address(self) -> str:
        return self.cluster[self.role][self.index] if self.role != EVALUATOR else "-"

    def named(self, *jobs: str) -> dict[str, str]:
        """The tasks of these jobs by name, as logs name them: {"ps 0": "node1:10256", ...}."""
        return {
            str(TaskId(job, index)): address
            for job in jobs
            for index, address in enumerate(self.cluster.get(job, ()))
        }

    @staticmethod
    def trainer_name(trainer_id: int) -> str:
        """The name of the trainer that hands the ps this token (see trainer_id)."""
        return str(TaskId(CHIEF, 0) if trainer_id == 0 else TaskId(WORKER, trainer_id - 1))

    def trainer_address(self, trainer_id: int) -> str:
        """The address of the trainer `trainer_id` names (see trainer_id)."""
        return self.cluster[CHIEF][0] if trainer_id == 0 else self.cluster[WORKER][trainer_id - 1]

    def keras_distribution(self) -> dict[str, str]:
        """What keras.distribution.initialize() reads with no arguments for this trainer (the
        chief's address first: JAX's coordination service listens there)."""
        addresses = [self.trainer_address(trainer) for trainer in range(self.trainers)]
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(addresses),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(self.trainers),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(self.trainer_id),
        }

    def jobs(self) -> dict[str, list[str]]:
        """The cluster as TF_CONFIG and tf.train.ClusterSpec take it: lists of addresses."""
        return {job: list(tasks) for job, tasks in self.cluster.items()}

    def threads(self, cpus: int, *, own_cpus: bool) -> Threads:
        """This task's threads, whose process may run on `cpus` CPUs: its own where `own_cpus`,
        else shared with the trainers whose addresses are on its host."""
        host = self.address.rpartition(":")[0]
        on_node = sum(
            address.rpartition(":")[0] == host
            for job in trainer_roles(self.coordinator)
            for address in self.cluster.get(job, ())
        )
        return sized_threads(
            self.role,
            cpus=cpus,
            trainers_on_node=1 if own_cpus else on_node,
            coordinator=self.coordinator,
        )

    def tf_config(self, **extra: Any) -> dict[str, Any]:
        config = write(
            self.jobs(),
            self.role,
            self.index,
            has_evaluator=self.has_evaluator,
            run_id=self.run_id,
            coordinator=self.coordinator,
        )
        return config | extra


class Shard(NamedTuple):
    """Which share of the training data a process reads: dataset.shard(*shard)."""

    num_shards: int
    shard_index: int


def input_shard(environ: Mapping[str, str] = os.environ) -> Shard:
    """This process's share of the training data, from its TF_CONFIG: trainer i of n (see
    trainer_id) reads shard i of n; any other process reads everything, Shard(1, 0)."""
    text = environ.get("TF_CONFIG")
    role = ClusterRole.from_json(text) if text else None
    if role is None or role.role not in (CHIEF, WORKER):
        return Shard(1, 0)
    return Shard(role.trainers, role.trainer_id)

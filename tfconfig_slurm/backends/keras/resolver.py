"""A tf.distribute cluster resolver backed by the core: this SLURM task's place in its step,
laid out as everywhere else, for a script that passes it to a strategy instead of setting
TF_CONFIG:

  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=tfconfig_slurm.cluster_resolver(all_reduce=True))
  strategy = tf.distribute.ParameterServerStrategy(
      tfconfig_slurm.cluster_resolver(coordinator=True))

The layout comes from the TFCONFIG_SLURM_* variables (the layout flags' names) and the
keyword arguments, which win. No environment string carries the cluster, so no 128 KiB
limit applies. The task's GPUs are set in CUDA_VISIBLE_DEVICES, as with-tfconfig sets them:
make the resolver before TensorFlow first looks at its devices.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import MutableMapping
from typing import Any

import tensorflow as tf
from absl import logging

from tfconfig_slurm.cluster import LayoutPolicy, in_job_step, read_slurm_step, render
from tfconfig_slurm.cluster.layout import EVALUATOR
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import place


def cluster_resolver(
    environ: MutableMapping[str, str] | None = None, **layout: Any
) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """This task's resolver. `layout` takes LayoutPolicy's fields (all_reduce=True,
    coordinator=True, ps_per_node=2, ...) over the TFCONFIG_SLURM_* variables; a bad value
    raises UsageError naming it. Sets CUDA_VISIBLE_DEVICES in `environ` (by default this
    process's) to the task's GPUs. Outside a job step of several tasks, the cluster of this
    process alone (none for a coordinator's layout)."""
    if environ is None:
        environ = os.environ
    policy = _policy(place.policy_from_environ(environ), layout)
    if not in_job_step(environ) or read_slurm_step(environ).shape.num_tasks == 1:
        return _alone(policy)
    step = read_slurm_step(environ)
    laid_out = place.step_layout(step, policy)
    task = laid_out.task(step.rank)
    environ.update(render.task_environment(laid_out, step.rank))
    # TensorFlow's own resolvers read the cluster from TF_CONFIG; this one carries it itself.
    environ.pop("TF_CONFIG", None)
    cluster = laid_out.cluster()
    if task.role == EVALUATOR:
        # Outside the cluster: ParameterServerStrategy's coordinator must not see it, and the
        # evaluator needs none.
        cluster = {EVALUATOR: [task.address]}
    logging.info(
        "rank %d on %s is %s %d at %s with GPUs [%s]",
        step.rank,
        task.node,
        task.role,
        task.index,
        task.address,
        ",".join(task.gpus),
    )
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type=task.role,
        task_id=task.index,
        num_accelerators={"GPU": len(task.gpus)} if task.gpus else None,
        rpc_layer="grpc",
    )


# What a LayoutPolicy field takes, by the first name in its annotation ("int | None"), for
# the check of an argument given for it, with an example.
_KINDS: dict[str, tuple[type, str, str]] = {
    "int": (int, "a whole number", "1"),
    "tuple": (tuple, "a tuple of roles", '("chief", "worker")'),
    "bool": (bool, "True or False", "True"),
    "str": (str, "a string", '"{node}-ib"'),
}


def _policy(variables: LayoutPolicy, layout: dict[str, Any]) -> LayoutPolicy:
    """The variables' policy with the keyword arguments over it; a bad argument raises
    UsageError naming it as the caller wrote it."""
    annotations = {field.name: str(field.type) for field in dataclasses.fields(LayoutPolicy)}
    for name, value in layout.items():
        if name not in annotations:
            raise UsageError(
                f"cluster_resolver({name}=...)",
                "is no layout setting",
                f"give only these: {', '.join(sorted(annotations))}",
            )
        kind, expected, example = _KINDS[re.split(r"[\[ |]", annotations[name])[0]]
        optional = annotations[name].endswith("| None")
        # A bool is an int to isinstance; not a count or a port.
        if not (value is None and optional) and (
            not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        ):
            raise UsageError(
                f"cluster_resolver({name}=...)",
                f"is {value!r}, expected {expected}",
                f"e.g. {name}={example}",
            )
    try:
        return dataclasses.replace(variables, **layout)
    except UsageError as error:
        name = error.culprit.removeprefix("--")
        if name not in layout:
            raise
        raise UsageError(f"cluster_resolver({name}=...)", error.problem, error.hint) from None


def _alone(policy: LayoutPolicy) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """Outside a job step of several tasks: this process alone, as TensorFlow's own resolvers
    give it without TF_CONFIG (MultiWorkerMirroredStrategy then mirrors its local devices);
    ParameterServerStrategy has no such cluster."""
    if policy.coordinator:
        raise UsageError(
            "cluster_resolver(coordinator=True)",
            "needs a SLURM job step of several tasks (a coordinator, parameter servers and "
            "workers), and this process is not one",
            "run the script in every task of a step: srun python my_script.py",
        )
    logging.info("not in a SLURM job step of several tasks: a cluster of this process alone")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))

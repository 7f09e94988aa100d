"""A tf.distribute cluster resolver backed by the core: this SLURM task's place in its step,
laid out as everywhere else, for a script that passes it to a strategy instead of setting
TF_CONFIG:

  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      cluster_resolver=tfconfig_slurm.cluster_resolver(all_reduce=True))
  strategy = tf.distribute.ParameterServerStrategy(
      tfconfig_slurm.cluster_resolver(coordinator=True))

The task's place comes from place.find, as for every entry point: a TF_CONFIG made for this
step (with-tfconfig's, a --local_cluster's) wins, so the resolver agrees with a wrapper around
the script; else the TFCONFIG_SLURM_* variables, under the keyword arguments. A TF_CONFIG the
resolver made is not left in the environment (so no 128 KiB limit applies). Make the resolver
before TensorFlow first looks at its devices: it sets the task's CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import MutableMapping
from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context

from tfconfig_slurm.cluster import LayoutPolicy
from tfconfig_slurm.cluster.layout import EVALUATOR
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import place

# How the resolver's layout settings are named in an error about them.
_SOURCE = "cluster_resolver(...)"
# The task addresses whose ports this process has found free.
_PORTS_CHECKED: set[str] = set()


def cluster_resolver(
    environ: MutableMapping[str, str] | None = None, **layout: Any
) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """This task's resolver. `layout` takes LayoutPolicy's fields (all_reduce=True,
    coordinator=True, ps_per_node=2, ...) over the TFCONFIG_SLURM_* variables; a bad value
    raises UsageError naming it. Sets CUDA_VISIBLE_DEVICES in `environ` (by default this
    process's) to the task's GPUs. Outside a job step of several tasks, and given no
    TF_CONFIG, the cluster of this process alone (none for a coordinator's layout)."""
    if environ is None:
        environ = os.environ
    policy = _policy(place.policy_from_environ(environ), layout)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    where = place.find(environ, policy, _SOURCE)
    # What TensorFlow's own resolver would read (an evaluator's names only itself): the
    # TF_CONFIG given, or the one made for the task, which the environment does not keep.
    tf_config = where.environment.get("TF_CONFIG") or environ.get("TF_CONFIG", "{}")
    where.set_in(environ, tf_config=False)
    if environ is os.environ and environ.get("CUDA_VISIBLE_DEVICES") != visible:
        _check_devices_not_listed(visible, environ.get("CUDA_VISIBLE_DEVICES", ""))
    if where.role is None:
        # This process alone, as TensorFlow's own resolvers give it without TF_CONFIG
        # (MultiWorkerMirroredStrategy then mirrors its local devices); ParameterServerStrategy
        # has no such cluster.
        if policy.coordinator:
            raise UsageError(
                "cluster_resolver(coordinator=True)",
                "needs a SLURM job step of several tasks (a coordinator, parameter servers and "
                "workers), and this process is not one",
                "run the script in every task of a step: srun python my_script.py",
            )
        logging.info("not in a SLURM job step of several tasks: a cluster of this process alone")
        return tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))
    role = where.role
    cluster = json.loads(tf_config)["cluster"]
    # A wrapper that gave the TF_CONFIG checked the port; a second resolver of this process
    # would find it held by this process's own server.
    if role.role != EVALUATOR and where.layout_source != "TF_CONFIG":
        if role.address not in _PORTS_CHECKED:
            watchdog.check_port_free(str(role.task_id), role.address)
        _PORTS_CHECKED.add(role.address)
    gpus = where.gpu_ids
    logging.info(
        "%s on %s at %s with GPUs [%s]",
        role.task_id,
        where.node,
        role.address,
        "any" if gpus is None else ",".join(gpus),
    )
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster),
        task_type=role.role,
        task_id=role.index,
        num_accelerators={"GPU": len(gpus)} if gpus else None,
        rpc_layer="grpc",
    )


def _check_devices_not_listed(before: str | None, now: str) -> None:
    """Raises UsageError where TensorFlow has listed its devices already: CUDA read
    CUDA_VISIBLE_DEVICES then, so the task's GPUs, set now, would not take effect."""
    # Where TensorFlow keeps the devices it found; it has no public word for whether it has.
    if getattr(context.context(), "_physical_devices", None) is None:
        return
    raise UsageError(
        "cluster_resolver()",
        f"sets this task's GPUs (CUDA_VISIBLE_DEVICES={now!r}, was "
        f"{'unset' if before is None else repr(before)}) after TensorFlow listed its devices, "
        "so they would not take effect",
        "make the resolver before any TensorFlow call that looks at devices (tf.config, a "
        "tensor, a model, a strategy)",
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

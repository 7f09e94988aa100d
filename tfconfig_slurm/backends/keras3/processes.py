"""The runtime's JAX processes of a run as one: JAX started in one function; the run's
keras.distribution over every process's devices (DataParallel, or ModelParallel where the
experiment gives a LayoutMap) and which share of the training data this process reads under
it; and the small agreements training needs (a stop, the checkpoint restored, the weights at
the end).

Processes that hold parts of one model replica must feed it the same batch, so the data is
shared out by replica, as Keras shares out a dataset it shards itself
(Distribution.data_shard_id): among the processes where each holds one replica or more,
among the replicas where a replica spans processes.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils

from tfconfig_slurm.backends.keras3 import gloo
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.user_code.experiment import KerasExperiment

# JAX keeps 32-bit integers unless its x64 mode is on: gather sends each value as two halves.
_HALF = 31
_LOW = (1 << _HALF) - 1


def start(role: ClusterRole | None) -> None:
    """JAX started for this process of the run, all of it before JAX makes its backends (which
    gloo.on refuses to follow), in this order: JAX's settings, read by what comes after; the
    CPU backend's factory with gloo on the task's address; this process's place among the run's
    processes; the run's seed, for every process must build the same initial weights (JAX
    refuses a variable whose value differs between them). A single process keeps JAX as it is."""
    if role is None:
        return
    # A process lost would otherwise end every other within a second or so, aborted by JAX's
    # own client (`Terminating process because the JAX distributed service detected fatal
    # errors`), before the watch (process/supervision/watchdog.py) could say which one was lost.
    jax.config.update("jax_enable_recoverability", True)
    # JAX's preemption notifier would take SIGTERM, which the runtime stops on.
    jax.config.update("jax_enable_preemption_service", False)
    gloo.on(role.address.rpartition(":")[0])
    jax.distributed.initialize(
        coordinator_address=role.trainer_address(0),
        num_processes=role.trainers,
        process_id=role.trainer_id,
        # Not JAX's SLURM detection, which would fill in what is not given: it takes
        # SLURM_LOCALID for the one GPU to use, among the ones this task cannot see.
        cluster_detection_method="deactivate",
    )
    # Not keras.utils.set_random_seed: it imports TensorFlow wherever one is installed, for
    # its seed too. Keras draws its default seeds from Python's random.
    seed = zlib.crc32((role.run_id or "").encode())
    random.seed(seed)
    np.random.seed(seed)


def gather(values: Sequence[int]) -> Any:
    """Every process's `values` (integers from 0 to 2**62), one row a process; in a single
    process, its own."""
    halves = np.asarray([[value >> _HALF, value & _LOW] for value in values], np.int32)
    rows = np.asarray(multihost_utils.process_allgather(halves)).astype(np.int64)
    return rows[..., 0] << _HALF | rows[..., 1]


class Mesh(NamedTuple):
    """The run's devices (every process's), this process's share of the training data under
    the distribution set for the run, the mesh in words for the start line ("" for one
    process on one device), and the parts each of this process's batches is split into over
    its devices (its examples must be a multiple of them)."""

    devices: int
    data_share: int
    data_shares: int
    described: str
    batch_parts: int = 1


def set_up_mesh(experiment: KerasExperiment, params: Mapping[str, Any], processes: int) -> Mesh:
    """Sets the run's distribution for the models built after it, and says it."""
    devices = keras.distribution.list_devices()
    if experiment.layout_map is None:
        if processes == 1 and len(devices) == 1:
            return Mesh(1, 0, 1, "")
        # Each process feeds its own batches, which make one global batch.
        distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    else:
        distribution = _model_parallel(experiment, devices, params)
    keras.distribution.set_distribution(distribution)
    shares = min(processes, distribution.num_model_replicas)
    mesh = distribution.device_mesh
    axes = " x ".join(f"{name} {size}" for name, size in zip(mesh.axis_names, mesh.shape))
    batch_axis = mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]
    return Mesh(
        len(devices),
        distribution.data_shard_id,
        shares,
        f"{type(distribution).__name__} on a mesh of {axes}",
        max(batch_axis // shares, 1),
    )


def _model_parallel(
    experiment: KerasExperiment, devices: list[Any], params: Mapping[str, Any]
) -> Any:
    """ModelParallel by the experiment's LayoutMap, or one line that says why it cannot be."""
    assert experiment.layout_map is not None
    layout_map = experiment.layout_map(devices, params)
    if not isinstance(layout_map, keras.distribution.LayoutMap):
        raise UsageError(
            "--experiment",
            f"{experiment.name}.layout_map(devices, params) returned "
            f"{type(layout_map).__name__!r}, not a keras.distribution.LayoutMap",
            "return keras.distribution.LayoutMap(keras.distribution.DeviceMesh(shape, "
            "axis_names, devices)) with the variables' layouts set",
        )
    mesh = layout_map.device_mesh
    if sorted(map(str, mesh.devices.flat)) != sorted(map(str, devices)):
        raise UsageError(
            "--experiment",
            f"{experiment.name}.layout_map's mesh holds {mesh.devices.size} of the run's "
            f"{len(devices)} devices",
            "build its DeviceMesh of every device layout_map is given, e.g. shape "
            f"({len(devices)} // model_shards, model_shards)",
        )
    try:
        # The batches are each process's own, shared out as data_share says.
        return keras.distribution.ModelParallel(layout_map=layout_map, auto_shard_dataset=False)
    except ValueError as error:
        raise UsageError(
            "--experiment",
            f"{experiment.name}.layout_map's mesh cannot be trained on: "
            f"{str(error).splitlines()[0]}",
            "give the mesh's first axis (the batch's) a size that divides the processes or "
            "that they divide",
        ) from None

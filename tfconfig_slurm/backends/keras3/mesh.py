"""The run's keras.distribution over every process's devices: DataParallel, or ModelParallel
where the experiment gives a LayoutMap; and which share of the training data this process
reads under it.

Processes that hold parts of one model replica must feed it the same batch, so the data is
shared out by replica, as Keras shares out a dataset it shards itself
(Distribution.data_shard_id): among the processes where each holds one replica or more,
among the replicas where a replica spans processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import keras

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.user_code.experiment import KerasExperiment


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


def set_up(experiment: KerasExperiment, params: Mapping[str, Any], processes: int) -> Mesh:
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

"""A Keras experiment's batches, checked: its dataset("train" or "eval", params)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.user_code.experiment import KerasExperiment


def experiment_dataset(
    experiment: KerasExperiment, mode: str, params: Mapping[str, Any]
) -> tf.data.Dataset:
    batches = experiment.dataset(mode, params)
    if not isinstance(batches, tf.data.Dataset):
        raise UsageError(
            "--experiment",
            f"{experiment.name}.dataset({mode!r}, params) returned a {type(batches).__name__}, "
            "not a tf.data.Dataset",
            "return batches of params['batch_size'], e.g. tf.data.Dataset.from_tensor_slices("
            "(x, y)).batch(params['batch_size'])",
        )
    return batches


def eval_batches(experiment: KerasExperiment, params: Mapping[str, Any]) -> tf.data.Dataset:
    """The whole eval set: in a cluster each trainer evaluates a share of each batch, and the
    metrics come out of evaluate() summed over all (the same on every trainer)."""
    batches = experiment_dataset(experiment, "eval", params)
    options = tf.data.Options()
    # Its examples come from Python or memory, not files: shard batches by their elements.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return batches.with_options(options)

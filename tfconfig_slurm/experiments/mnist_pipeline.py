"""The MNIST digits of mnist_data.py as TensorFlow datasets, for mnist_deep and mnist_keras.
Examples are fed from a generator in chunks, never embedded in the graph as constants."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfconfig_slurm.experiments.mnist_data import IMAGE_SIZE, load_examples

# Examples per call of the input generator.
_CHUNK = 1024


def dataset(params: dict[str, Any], *, training: bool, in_graph: bool = False) -> tf.data.Dataset:
    """Batches of (images, labels); for training, this trainer's shard, shuffled, repeated.
    The examples come from Python, so that Estimator's graph (kept in its event files) does
    not hold them; `in_graph` puts them in the graph, for a dataset another process builds
    (a ParameterServerStrategy worker), which cannot call back into this one's Python."""
    images, labels = load_examples(params.get("data_dir"), training)

    # Chunks, which unbatch() splits inside TensorFlow: a Python call per example is slow.
    def chunks() -> Any:
        for start in range(0, len(labels), _CHUNK):
            yield images[start : start + _CHUNK], labels[start : start + _CHUNK]

    examples = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        if in_graph
        else tf.data.Dataset.from_generator(
            chunks,
            output_signature=(
                tf.TensorSpec((None, IMAGE_SIZE, IMAGE_SIZE, 1), tf.float32),
                tf.TensorSpec((None,), tf.int32),
            ),
        ).unbatch()
    )
    if training:
        # Each trainer of a cluster reads its own share of the examples.
        examples = examples.shard(params.get("num_trainers", 1), params.get("trainer_index", 0))
        examples = examples.shuffle(params["shuffle_buffer"]).repeat()
    return examples.batch(params["batch_size"]).prefetch(2)

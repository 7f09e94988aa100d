"""Deep MNIST: the convnet of the seed scripts (conv 5x5x32, pool, conv 5x5x64, pool, dense 1024,
dropout, dense 10; Adam) as an Estimator model_fn, for TensorFlow 2.15, on the MNIST files in
`--data_dir`, else the digits that ship here (mnist_data.py)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfconfig_slurm.experiments.mnist_data import (
    CLASSES,
    IMAGE_SIZE,
    check_data,  # noqa: F401 (the runtime calls it: a bad --data_dir is one line)
    check_hparams,  # noqa: F401 (the runtime calls it: a bad --hparams value is one line)
)
from tfconfig_slurm.experiments.mnist_pipeline import dataset

HPARAMS = {"learning_rate": 1e-3, "dropout": 0.5, "shuffle_buffer": 10_000}


def input_fn(mode: str, params: dict[str, Any]) -> tf.data.Dataset:
    return dataset(params, training=mode == tf.estimator.ModeKeys.TRAIN)


def model_fn(
    features: tf.Tensor, labels: tf.Tensor | None, mode: str, params: dict[str, Any]
) -> tf.estimator.EstimatorSpec:
    training = mode == tf.estimator.ModeKeys.TRAIN
    layers = tf.keras.layers
    hidden = layers.Conv2D(32, 5, padding="same", activation="relu")(features)
    hidden = layers.MaxPool2D(2)(hidden)
    hidden = layers.Conv2D(64, 5, padding="same", activation="relu")(hidden)
    hidden = layers.MaxPool2D(2)(hidden)
    hidden = layers.Dense(1024, activation="relu")(layers.Flatten()(hidden))
    hidden = layers.Dropout(params["dropout"])(hidden, training=training)
    logits = layers.Dense(CLASSES)(hidden)
    classes = tf.argmax(logits, axis=1, output_type=tf.int32)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode,
            predictions={"classes": classes, "probabilities": tf.nn.softmax(logits)},
            export_outputs={"classes": tf.estimator.export.PredictOutput({"classes": classes})},
        )
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    # The streaming metric is for evaluation (its own name scope, so that the training scalar
    # below keeps the tag "accuracy"); training records each batch's accuracy.
    accuracy = tf.compat.v1.metrics.accuracy(
        labels=labels, predictions=classes, name="streaming_accuracy"
    )
    tf.compat.v1.summary.scalar(
        "accuracy", tf.reduce_mean(tf.cast(tf.equal(classes, labels), tf.float32))
    )
    optimizer = tf.compat.v1.train.AdamOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op, eval_metric_ops={"accuracy": accuracy}
    )


def serving_input_receiver_fn() -> tf.estimator.export.TensorServingInputReceiver:
    images = tf.compat.v1.placeholder(tf.float32, [None, IMAGE_SIZE, IMAGE_SIZE, 1], "images")
    return tf.estimator.export.TensorServingInputReceiver(images, {"images": images})

"""Deep MNIST in Keras (tf-keras), for TensorFlow 2.16+: mnist_deep's convnet on the same data
(the MNIST files in `--data_dir`, else the digits that ship here: mnist_data.py)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from tfconfig_slurm.experiments.mnist_data import (
    CLASSES,
    IMAGE_SIZE,
    check_data,  # noqa: F401 (the runtime calls it: a bad --data_dir is one line)
    check_hparams,  # noqa: F401 (the runtime calls it: a bad --hparams value is one line)
)
from tfconfig_slurm.experiments.mnist_pipeline import dataset as mnist_dataset

HPARAMS = {"learning_rate": 1e-3, "dropout": 0.5, "shuffle_buffer": 10_000}


def build_model(params: dict[str, Any]) -> keras.Model:
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 1)),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPool2D(2),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPool2D(2),
            layers.Flatten(),
            layers.Dense(1024, activation="relu"),
            layers.Dropout(params["dropout"]),
            layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(params["learning_rate"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def dataset(mode: str, params: dict[str, Any]) -> tf.data.Dataset:
    # In the graph: a ParameterServerStrategy worker builds it, away from this Python.
    return mnist_dataset(params, training=mode == "train", in_graph=True)

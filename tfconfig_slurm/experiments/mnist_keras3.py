"""Deep MNIST in Keras 3 (`import keras`), trained on JAX without TensorFlow: mnist_keras's
convnet on the same data (mnist_data.py), as numpy batches of each process's own share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras

from tfconfig_slurm.experiments.mnist_data import (
    CLASSES,
    IMAGE_SIZE,
    Examples,
    batches,
    check_data,  # noqa: F401 (the runtime calls it: a bad --data_dir is one line)
    check_hparams,  # noqa: F401 (the runtime calls it: a bad --hparams value is one line)
)

HPARAMS = {"learning_rate": 1e-3, "dropout": 0.5}


def build_model(params: dict[str, Any]) -> keras.Model:
    layers = keras.layers
    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 1)),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
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


def dataset(mode: str, params: dict[str, Any]) -> Iterator[Examples]:
    return batches(params, training=mode == "train")

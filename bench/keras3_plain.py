"""The plain Keras 3 script a user writes, which bench/keras3_speed.py measures the runtime
against: mnist_keras3's model, `model.fit` with no callback of its own, timed by its epochs
(an epoch-end hook only, which leaves Keras's batch-end dispatch asynchronous). Prints one JSON
line: the examples/s of the epochs after the first (which compiles).

  python bench/keras3_plain.py BATCH_SIZE EPOCHS arrays|generator

- arrays: `model.fit(x, y, batch_size=B)` on numpy arrays, the shipped digits repeated to
  MNIST's 60,000 or so examples a pass, so that an epoch is a pass of a real data set's size;
- generator: fit on the shipped generator (mnist_data.batches), epochs of 100 steps.
Where this process has several devices (GPUs), it trains data-parallel over them, as the
runtime's one process does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

from tfconfig_slurm.experiments import mnist_data, mnist_keras3

_REPEATS = 40
_GENERATOR_STEPS = 100


def main(batch_size: int, epochs: int, data: str) -> None:
    if len(keras.distribution.list_devices()) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    params: dict[str, Any] = {**mnist_keras3.HPARAMS, "batch_size": batch_size, "data_dir": None}
    model = mnist_keras3.build_model(params)
    ends: list[float] = []
    timer = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ends.append(time.monotonic()))
    if data == "arrays":
        images, labels = mnist_data.load_examples(None, True)
        x, y = np.tile(images, (_REPEATS, 1, 1, 1)), np.tile(labels, _REPEATS)
        model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=[timer], verbose=0)
        examples = len(y)
    else:
        model.fit(
            mnist_keras3.dataset("train", params),
            epochs=epochs,
            steps_per_epoch=_GENERATOR_STEPS,
            callbacks=[timer],
            verbose=0,
        )
        examples = _GENERATOR_STEPS * batch_size
    rate = (len(ends) - 1) * examples / (ends[-1] - ends[0])
    print(json.dumps({"examples_per_sec": rate}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

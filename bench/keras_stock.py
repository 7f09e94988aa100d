"""The stock tf-keras job bench/keras_peers.py measures the runtime against: mnist_keras's model
and data in a plain script, as TensorFlow's multi-worker tutorial writes it:
MultiWorkerMirroredStrategy over the cluster of the TF_CONFIG it is given (without one, a single
process on the default strategy), each worker reading its own share of the data, TensorFlow's
default threads. Prints one JSON line: the process's examples/s from its second step to its
last, and the processes.

  TF_CONFIG=... python bench/keras_stock.py STEPS BATCH_SIZE
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf
import tf_keras as keras
from stock_fit import fit_and_report

from tfconfig_slurm.experiments import mnist_keras

steps, batch_size = int(sys.argv[1]), int(sys.argv[2])
cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
processes = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1
strategy = (
    tf.distribute.MultiWorkerMirroredStrategy() if processes > 1 else tf.distribute.get_strategy()
)
params: dict[str, Any] = {**mnist_keras.HPARAMS, "batch_size": batch_size, "data_dir": None}


def batches(context: tf.distribute.InputContext) -> tf.data.Dataset:
    share = {
        **params,
        "num_trainers": context.num_input_pipelines,
        "trainer_index": context.input_pipeline_id,
    }
    return mnist_keras.dataset("train", share).repeat()


with strategy.scope():
    model = mnist_keras.build_model(params)
fit_and_report(
    model,
    strategy.distribute_datasets_from_function(batches),
    keras.callbacks.Callback,
    steps=steps,
    batch_size=batch_size,
    processes=processes,
)

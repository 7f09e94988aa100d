"""The stock Keras 3 job `bench/keras_peers.py --flavor keras3` measures the runtime against:
mnist_keras3's model and data in a plain script, its processes joined by JAX's own SLURM detection
(`jax.distributed.initialize()` with no arguments reads SLURM_* itself) where SLURM_NTASKS
says more than one, data-parallel as Keras's distribution guide writes it. Prints one JSON line:
the process's examples/s from its second step to its last, and the processes.

  python bench/keras3_stock.py STEPS BATCH_SIZE
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
from stock_fit import fit_and_report

from tfconfig_slurm.experiments import mnist_keras3

steps, batch_size = int(sys.argv[1]), int(sys.argv[2])
processes = int(os.environ.get("SLURM_NTASKS", "1"))
if processes > 1:
    jax.distributed.initialize()
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(
            devices=keras.distribution.list_devices(), auto_shard_dataset=False
        )
    )
    keras.utils.set_random_seed(1)
params: dict[str, Any] = {
    **mnist_keras3.HPARAMS,
    "batch_size": batch_size,
    "data_dir": None,
    "num_trainers": processes,
    "trainer_index": jax.process_index(),
}


model = mnist_keras3.build_model(params)
fit_and_report(
    model,
    mnist_keras3.dataset("train", params),
    keras.callbacks.Callback,
    steps=steps,
    batch_size=batch_size,
    processes=processes,
)

"""What a Keras 3 process on JAX is given beside keras.distribution's variables, by
with-tfconfig --keras3 and tfconfig_slurm.keras_distribution() alike; and the folder put first
on a --keras3 command's PYTHONPATH, for its sitecustomize.py. No JAX imported here."""

from __future__ import annotations

from pathlib import Path

from tfconfig_slurm.backends.keras3.boot.sitecustomize import (
    ALONE,
    HOST_VARIABLE,
    JOINED,
    NOTES_VARIABLE,
)

__all__ = ["ALONE", "FOLDER", "JOINED", "NOTES_VARIABLE", "jax_variables"]

FOLDER = Path(__file__).resolve().parent


def jax_variables(host: str, gpus: str) -> dict[str, str]:
    """JAX's settings for a task on `host` given the GPUs `gpus` (CUDA_VISIBLE_DEVICES):

    - JAX_LOCAL_DEVICE_IDS: all the GPUs it is given. Without it, jax.distributed reads
      SLURM_LOCALID as the one GPU to use, an id among the node's GPUs, where the task sees
      only its own (its first is 0): a task of local id 1 would ask for a GPU it cannot see.
    - JAX_ENABLE_PREEMPTION_SERVICE=false: JAX's preemption notifier would take SIGTERM, and a
      scancel would no longer end the process before SLURM kills it.
    - gloo's address (sitecustomize.py).
    """
    count = len([gpu for gpu in gpus.split(",") if gpu])
    return {
        "JAX_LOCAL_DEVICE_IDS": ",".join(map(str, range(max(count, 1)))),
        "JAX_ENABLE_PREEMPTION_SERVICE": "false",
        HOST_VARIABLE: host,
    }

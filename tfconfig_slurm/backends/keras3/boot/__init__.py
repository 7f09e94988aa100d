"""A Keras 3 process on JAX as with-tfconfig --keras3 starts it, or as a script under plain
srun starts itself: keras.distribution.initialize(*tfconfig_slurm.keras_distribution());
JAX's variables beside keras.distribution's (jax_variables), given by both; and the folder put
first on a --keras3 command's PYTHONPATH, for its sitecustomize.py. Imports no Keras and no
JAX but JAX's registry (gloo.py).

keras_distribution() finds the task's place by the one door every entry point takes
(process/place.find), laid out as with --all_reduce: a TF_CONFIG made for this step
(with-tfconfig's) wins; else the step's layout, with the TFCONFIG_SLURM_* variables. It sets
CUDA_VISIBLE_DEVICES to the task's GPUs by SLURM's ids and JAX's own variables, and puts JAX's
CPU collectives on the task's own address (gloo.py): call it before JAX is initialized.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import MutableMapping
from pathlib import Path
from typing import NamedTuple

from tfconfig_slurm.backends.keras3 import gloo
from tfconfig_slurm.backends.keras3.boot.sitecustomize import (
    ALONE,
    HOST_VARIABLE,
    JOINED,
    NOTES_VARIABLE,
)
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import place
from tfconfig_slurm.process.user_code import versions

__all__ = ["ALONE", "FOLDER", "JOINED", "NOTES_VARIABLE", "jax_variables", "keras_distribution"]

FOLDER = Path(__file__).resolve().parent
# How the layout's settings are named in an error about them.
_SOURCE = "keras_distribution()"


class KerasDistribution(NamedTuple):
    """keras.distribution.initialize's arguments: the processes' addresses (the first is
    JAX's coordination service, process 0's), their number, and this process's id."""

    job_addresses: str
    num_processes: int
    process_id: int


def keras_distribution(environ: MutableMapping[str, str] | None = None) -> KerasDistribution:
    """This task's arguments for keras.distribution.initialize; a bad layout setting raises
    UsageError naming it. Outside a job step of several tasks (and given no TF_CONFIG), the
    one process's own: this machine's address, 1, 0."""
    versions.require_keras3(_SOURCE)
    if environ is None:
        environ = os.environ
    # Read by Keras as it is first imported, which comes after this call.
    environ.setdefault("KERAS_BACKEND", "jax")
    policy = place.policy_from_environ(environ)
    # Laid out as with-tfconfig --keras3 does: a setting that adds other tasks than the
    # processes of one mesh is refused (an evaluator's gave a process id beyond the processes'
    # count, which JAX refuses only once Keras is imported).
    given = {
        "--ps_per_node": policy.ps_per_node is not None,
        "--roles": policy.roles is not None,
        "--evaluator": policy.evaluator,
        "--coordinator": policy.coordinator,
    }
    for flag, set_ in given.items():
        if set_:
            variable = place.POLICY_VARIABLES[flag]
            raise UsageError(
                variable,
                "lays out other tasks than trainers, and keras_distribution() gives one JAX "
                "process a task, all of them training",
                f"unset {variable}: keras_distribution() lays the step out as --all_reduce does",
            )
    policy = dataclasses.replace(policy, all_reduce=True)
    where = place.find(environ, policy, _SOURCE)
    # No environment string carries the cluster, as with the tf.distribute resolver.
    where.set_in(environ, tf_config=False)
    if where.role is None:
        # A port free on this machine now, for a single process's own coordination service.
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            return KerasDistribution(f"localhost:{probe.getsockname()[1]}", 1, 0)
    if where.role.trainer_id == 0:
        # Where JAX's coordination service is to listen.
        watchdog.check_port_free(str(where.role.task_id), where.role.address)
    values = where.role.keras_distribution()
    host = where.role.address.rpartition(":")[0]
    environ.update(jax_variables(host, environ.get("CUDA_VISIBLE_DEVICES", "")))
    gloo.on(host)
    return KerasDistribution(
        values["KERAS_DISTRIBUTION_JOB_ADDRESSES"],
        int(values["KERAS_DISTRIBUTION_NUM_PROCESSES"]),
        int(values["KERAS_DISTRIBUTION_PROCESS_ID"]),
    )


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

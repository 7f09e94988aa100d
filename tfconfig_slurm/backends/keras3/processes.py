"""The JAX processes of a run as one: jax.distributed joined from the task's role, CPU
collectives on the node's own address, one random seed, and the small agreements training
needs (a stop, the checkpoint restored).

JAX's public API leaves gloo, its CPU collectives, to advertise whatever the machine's
hostname resolves to: 127.0.0.1 on hosts with Debian's `127.0.1.1 <hostname>` line and on the
test cluster's nodes, where every connection between nodes was refused
(../shared/reference/KERAS3_FACTS.md). The CPU backend is therefore made here, through JAX's
own factory, with gloo told the address the layout gives this task. That uses JAX's internal
modules (jax._src); a JAX that changes them is refused in one line at the start.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import InstallError

# JAX keeps 32-bit integers unless its x64 mode is on: gather sends each value as two halves.
_HALF = 31
_LOW = (1 << _HALF) - 1
# What a collective raises where a peer is gone (gloo: "Connection closed by peer").
COLLECTIVE_ERRORS = (jax.errors.JaxRuntimeError,)


def join(role: ClusterRole | None) -> None:
    """This process's place among the run's JAX processes (none for a single process), and
    the run's seed: every process must build the same initial weights (JAX refuses a
    variable whose value differs between them)."""
    if role is None:
        return
    # A process lost would otherwise end every other within a second or so, aborted by JAX's
    # own client (`Terminating process because the JAX distributed service detected fatal
    # errors`), before the watch (process/watchdog.py) could say which one was lost.
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(
        coordinator_address=role.trainer_address(0),
        num_processes=role.trainers,
        process_id=role.trainer_id,
    )
    _collectives_on(role.address.rpartition(":")[0])
    # Not keras.utils.set_random_seed: it imports TensorFlow wherever one is installed, for
    # its seed too. Keras draws its default seeds from Python's random.
    seed = zlib.crc32((role.run_id or "").encode())
    random.seed(seed)
    np.random.seed(seed)


def _collectives_on(host: str) -> None:
    """JAX's CPU backend, made on first use, with gloo on `host` (see the module's note)."""
    try:
        from jax._src import distributed, xla_bridge  # noqa: PLC0415
        from jax._src.lib import _jax  # noqa: PLC0415

        make_client, register = xla_bridge.make_cpu_client, xla_bridge.register_backend_factory
        make_gloo = _jax.make_gloo_tcp_collectives
    except (ImportError, AttributeError) as error:
        raise InstallError(
            f"JAX {jax.__version__}",
            f"lacks the internal function tfconfig-slurm gives gloo its address with ({error})",
            "install a JAX release from 0.4.35 to 0.12 (pip install 'jax<0.13')",
        ) from None

    def cpu_client() -> Any:
        gloo = make_gloo(distributed_client=distributed.global_state.client, hostname=host)
        return make_client(collectives=gloo)

    register("cpu", cpu_client, priority=0, fail_quietly=False)


def gather(values: list[int]) -> Any:
    """Every process's `values` (integers from 0 to 2**62), one row a process; in a single
    process, its own."""
    halves = np.asarray([[value >> _HALF, value & _LOW] for value in values], np.int32)
    rows = np.asarray(multihost_utils.process_allgather(halves)).astype(np.int64)
    return rows[..., 0] << _HALF | rows[..., 1]

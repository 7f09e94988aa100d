"""The runtime's JAX processes of a run as one: JAX started in one function, and the small
agreements training needs (a stop, the checkpoint restored, the weights at the end)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from tfconfig_slurm.backends.keras3 import gloo
from tfconfig_slurm.cluster.role import ClusterRole

# JAX keeps 32-bit integers unless its x64 mode is on: gather sends each value as two halves.
_HALF = 31
_LOW = (1 << _HALF) - 1
# What a collective raises where a peer is gone, among other failures: JAX's runtime error,
# or where gloo fails in a gather, a ValueError (seen: `UNKNOWN: Gloo AllGather failed: ...
# Connection closed by peer`, in an evaluation). lost_a_peer tells a loss among them.
COLLECTIVE_ERRORS = (jax.errors.JaxRuntimeError, ValueError)
# How those read where a peer is gone: gloo's "Connection closed by peer" (seen), a reset
# connection, an unreachable peer.
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "UNAVAILABLE")


def lost_a_peer(error: Exception) -> bool:
    """Whether a collective's `error` says a peer is gone (not this process's own failure, an
    out-of-memory or a compiler's)."""
    return any(words in str(error) for words in _LOST_PEER)


def first_line(error: Exception) -> str:
    """The error's type and its message's first line, for a log line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def start(role: ClusterRole | None) -> None:
    """JAX started for this process of the run, all of it before JAX makes its backends (which
    gloo.on refuses to follow), in this order: JAX's settings, read by what comes after; the
    CPU backend's factory with gloo on the task's address; this process's place among the run's
    processes; the run's seed, for every process must build the same initial weights (JAX
    refuses a variable whose value differs between them). A single process keeps JAX as it is."""
    if role is None:
        return
    # A process lost would otherwise end every other within a second or so, aborted by JAX's
    # own client (`Terminating process because the JAX distributed service detected fatal
    # errors`), before the watch (process/supervision/watchdog.py) could say which one was lost.
    jax.config.update("jax_enable_recoverability", True)
    # JAX's preemption notifier would take SIGTERM, which the runtime stops on.
    jax.config.update("jax_enable_preemption_service", False)
    gloo.on(role.address.rpartition(":")[0])
    jax.distributed.initialize(
        coordinator_address=role.trainer_address(0),
        num_processes=role.trainers,
        process_id=role.trainer_id,
        # Not JAX's SLURM detection, which would fill in what is not given: it takes
        # SLURM_LOCALID for the one GPU to use, among the ones this task cannot see.
        cluster_detection_method="deactivate",
    )
    # Not keras.utils.set_random_seed: it imports TensorFlow wherever one is installed, for
    # its seed too. Keras draws its default seeds from Python's random.
    seed = zlib.crc32((role.run_id or "").encode())
    random.seed(seed)
    np.random.seed(seed)


def gather(values: Sequence[int]) -> Any:
    """Every process's `values` (integers from 0 to 2**62), one row a process; in a single
    process, its own."""
    halves = np.asarray([[value >> _HALF, value & _LOW] for value in values], np.int32)
    rows = np.asarray(multihost_utils.process_allgather(halves)).astype(np.int64)
    return rows[..., 0] << _HALF | rows[..., 1]

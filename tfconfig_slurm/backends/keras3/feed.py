"""The training batches fit reads from an experiment's generator (process/task/look_ahead.py):
at most the steps left, read ahead on a thread of their own and, in one process, placed on
its devices there.

- fit runs --steps_per_execution steps a call and reads that many batches each; the last call
  would run past --train_steps (Keras's epoch iterator asks for whole executions), so the
  batches end there and the call runs the steps left.
- In one process, each batch is put on the devices as the run's distribution lays it out, as
  Keras would (the same arrays, so Keras's own placement is then a no-op); in a step of several
  processes, Keras makes the global array from each process's part as fit reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import jax
import keras

from tfconfig_slurm.process.task.look_ahead import LookAhead


def fed(batches: Iterator[Any], steps: int) -> LookAhead:
    """`steps` of `batches`, read ahead and placed; called on the training thread, where
    Keras keeps the run's distribution (per thread)."""
    return LookAhead(batches, steps, _placement(keras.distribution.distribution()))


def _placement(distribution: Any) -> Callable[[Any], Any]:
    """How a batch is put on this process's devices before fit reads it: each array (a None,
    such as absent sample weights, left so) as the distribution lays out data, or on the
    default device; in a step of several processes, not at all."""
    if jax.process_count() > 1:
        return _as_given

    def placed(array: Any) -> Any:
        if distribution is None:
            return jax.device_put(array)
        return jax.device_put(array, distribution.get_data_layout(array.shape).backend_layout)

    return lambda batch: keras.tree.map_structure(placed, batch, none_is_leaf=False)


def _as_given(batch: Any) -> Any:
    return batch

"""How often a Keras run (tf-keras's or Keras 3's) checkpoints and its trainers agree on a stop,
and whether a step passed such a multiple. No framework here."""

from __future__ import annotations

# Without --save_checkpoints_steps, a checkpoint this often (and at every stop and the end).
DEFAULT_CHECKPOINT_STEPS = 1000
# The trainers of a cluster agree on a stop this often: an all-reduce of a flag took 3.4 ms
# here (tf-keras), a gather 1-4 ms (JAX), a cost not worth paying every step; a stop waits at
# most this many steps.
STOP_CHECK_STEPS = 10


def passed(before: int, after: int, every: int) -> bool:
    """Whether going from global step `before` to `after` passed a multiple of `every`: fit
    may run several steps a call of its callbacks (steps_per_execution), so that the step it
    reports skips the multiple itself."""
    return after // every > before // every

"""How often a Keras run (tf-keras's or Keras 3's) checkpoints and its trainers agree on a stop,
and whether a step passed such a multiple. No framework here."""

from __future__ import annotations

import time

# With neither --save_checkpoints_steps nor --save_checkpoints_secs, a checkpoint this often by
# steps or by time, whichever comes first (and at every stop and the end): a restart of a
# failed step loses at most this much, as an Estimator run's 600 s (Estimator's own default).
DEFAULT_CHECKPOINT_STEPS = 1000
DEFAULT_CHECKPOINT_SECONDS = 600.0
# The trainers of a cluster agree on a stop this often: an all-reduce of a flag took 3.4 ms
# here (tf-keras), a gather 1-4 ms (JAX), a cost not worth paying every step; a stop waits at
# most this many steps.
STOP_CHECK_STEPS = 10


def passed(before: int, after: int, every: int) -> bool:
    """Whether going from global step `before` to `after` passed a multiple of `every`: fit
    may run several steps a call of its callbacks (steps_per_execution), so that the step it
    reports skips the multiple itself."""
    return after // every > before // every


class CheckpointCadence:
    """When a Keras run checkpoints: where a step passes a multiple of `steps`, or where
    `seconds` have passed since its last checkpoint, whichever comes first (None: never by
    that). The trainers of a cluster agree on the time at their stop checks, as each reads
    its own clock."""

    def __init__(self, steps: int | None, seconds: float | None) -> None:
        self._steps = steps
        self._seconds = seconds
        self._last = time.monotonic()

    @classmethod
    def of(cls, save_steps: int | None, save_secs: float | None) -> CheckpointCadence:
        """The flag given (--save_checkpoints_steps or --save_checkpoints_secs) alone, else
        both defaults."""
        if save_steps is None and save_secs is None:
            return cls(DEFAULT_CHECKPOINT_STEPS, DEFAULT_CHECKPOINT_SECONDS)
        return cls(save_steps, save_secs)

    def by_steps(self, before: int, after: int) -> bool:
        """Whether going from global step `before` to `after` passed a checkpoint's step."""
        return self._steps is not None and passed(before, after, self._steps)

    def by_time(self) -> bool:
        """Whether this process's clock says a checkpoint is due."""
        return self._seconds is not None and time.monotonic() - self._last >= self._seconds

    def saved(self) -> None:
        """A checkpoint was written: the time counts from now."""
        self._last = time.monotonic()

"""How often a Keras run (tf-keras's or Keras 3's) checkpoints and its trainers agree on a stop,
whether a step passed such a multiple, and what follows each step of a Keras trainer: one
decision for both Keras backends, which supply only how their trainers sum their votes. No
framework here."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Callable, NamedTuple

from absl import logging

from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.settings import TrainingSettings

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


# The trainers' votes summed over them, each trainer's in the same order: an all-reduce, a
# gather. A collective: every trainer calls it at the same steps.
SumVotes = Callable[[Sequence[int]], Sequence[float]]


class StepEnd(NamedTuple):
    """What a trainer does once a step has ended: checkpoint it, and stop on the signal
    `stop_on` ("" to go on)."""

    save: bool
    stop_on: str


class StepEnds:
    """What follows each step of a Keras trainer: the step said to the hang watch, a
    checkpoint where due by steps or by time (during which the watch rests: a large model's
    write to a slow file system is no hang), and a stop on a signal. With `sum_votes` (a
    cluster's trainers), every STOP_CHECK_STEPS steps the trainers agree, so that all of them
    stop, or save, at the same step (a checkpoint is a collective); a requeueing signal any
    of them got stands for all, so that the chief requeues even where only another was told,
    and a checkpoint any of them finds due by its clock is due for all."""

    def __init__(
        self,
        settings: TrainingSettings,
        stop: preemption.StopRequest,
        requeue_on: Collection[str],
        sum_votes: SumVotes | None,
    ) -> None:
        self._cadence = CheckpointCadence.of(
            settings.save_checkpoints_steps, settings.save_checkpoints_secs
        )
        self._stop = stop
        self._requeue_on = requeue_on
        self._sum_votes = sum_votes
        self._step = 0

    def after(self, before: int, step: int) -> StepEnd:
        """What follows the step that took the global step from `before` to `step`."""
        hang_watch.stepped(step)
        self._step = step
        stop_on, due = self._agreed(before, step)
        if stop_on:
            logging.info("stopping on %s at global step %d", stop_on, step)
        save = bool(stop_on) or due or self._cadence.by_steps(before, step)
        if save:
            hang_watch.paused()
        return StepEnd(save, stop_on)

    def saved(self) -> None:
        """The trainer wrote the checkpoint `after` asked for."""
        self._cadence.saved()
        hang_watch.stepped(self._step)

    def _agreed(self, before: int, step: int) -> tuple[str, bool]:
        own = self._stop.signal_name if self._stop.requested else ""
        if self._sum_votes is None:
            return own, self._cadence.by_time()
        if not passed(before, step, STOP_CHECK_STEPS):
            return "", False
        votes = self._sum_votes(
            [int(bool(own)), int(own in self._requeue_on), int(self._cadence.by_time())]
        )
        due = bool(votes[2])
        if not votes[0]:
            return "", due
        if votes[1] and own not in self._requeue_on:
            return min(self._requeue_on), due
        return own or preemption.PEERS_SIGNAL, due

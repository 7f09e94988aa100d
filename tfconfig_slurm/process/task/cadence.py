"""When a Keras run checkpoints and its trainers agree on a stop: one decision for both Keras
backends, which supply only how their trainers sum their votes. No framework here."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Callable, NamedTuple

from absl import logging

from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.settings import TrainingSettings

# Without --save_checkpoints_steps or --save_checkpoints_secs: a restart loses at most this much
# (600 s is Estimator's own default).
DEFAULT_CHECKPOINT_STEPS = 1000
DEFAULT_CHECKPOINT_SECONDS = 600.0
# The trainers agree on a stop this often, not every step: each agreement is a collective.
STOP_CHECK_STEPS = 10


def passed(before: int, after: int, every: int) -> bool:
    """Whether global step `before` -> `after` passed a multiple of `every` (fit may run several
    steps a callback, skipping the multiple itself)."""
    return after // every > before // every


class CheckpointCadence:
    """A checkpoint at a multiple of `steps` or `seconds` after the last, whichever comes first
    (None: never by that)."""

    def __init__(self, steps: int | None, seconds: float | None) -> None:
        self._steps = steps
        self._seconds = seconds
        self._last = time.monotonic()

    @classmethod
    def of(cls, save_steps: int | None, save_secs: float | None) -> CheckpointCadence:
        """The flag given alone, else both defaults."""
        if save_steps is None and save_secs is None:
            return cls(DEFAULT_CHECKPOINT_STEPS, DEFAULT_CHECKPOINT_SECONDS)
        return cls(save_steps, save_secs)

    def by_steps(self, before: int, after: int) -> bool:
        """Whether global step `before` -> `after` passed a checkpoint's step."""
        return self._steps is not None and passed(before, after, self._steps)

    def by_time(self) -> bool:
        """Whether this process's clock says a checkpoint is due."""
        return self._seconds is not None and time.monotonic() - self._last >= self._seconds

    def saved(self) -> None:
        """A checkpoint was written: the time counts from now."""
        self._last = time.monotonic()


# The trainers' votes summed, in order (an all-reduce, a gather): a collective.
SumVotes = Callable[[Sequence[int]], Sequence[float]]


class StepEnd(NamedTuple):
    """Once a step ended: whether to checkpoint it, and the signal to stop on ("" to go on)."""

    save: bool
    stop_on: str


class StepEnds:
    """What follows each step of a Keras trainer: the hang watch told (resting during a
    checkpoint: a slow write is no hang), a checkpoint where due, a stop on a signal. With
    `sum_votes`, the trainers agree every STOP_CHECK_STEPS steps, so that all stop or save at
    the same step (a checkpoint is a collective); a requeueing signal or a due checkpoint any
    of them has stands for all, so that the chief requeues even where only another was told."""

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

"""One throughput meter for every backend's trainers, and the progress lines scripts grep:

    first step done (global step 151)
    step 200: loss 0.1043, 3052.4 examples/s, 47.69 global steps/s
    last step done after 450 steps here; mean 3011.7 examples/s

A line comes each time the global step, as this trainer sees it, passes a multiple of
--log_every_steps (with parameter servers, the step it sees then: 102 for 100). The means leave
the first step out: it includes building the model. No TensorFlow here.

The run's owner also keeps the global step of its first step and latest line in progress.json
(report_progress_to), for the runs table while it trains (a checkpoint's step lags) and for the
restart of a step, which it tells that the step trained.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import NamedTuple

from absl import logging

from tfconfig_slurm.process.records import reports


class Mark(NamedTuple):
    """A moment of the run, as this trainer saw it."""

    seconds: float
    local_steps: int
    global_step: int
    examples: int


class Rates(NamedTuple):
    """Speeds between two marks; examples_per_sec is None where examples are not counted."""

    examples_per_sec: float | None
    global_steps_per_sec: float


class _Progress:
    """Where this process keeps its progress, set once it owns a run."""

    path: Path | None = None


_PROGRESS = _Progress()


def report_progress_to(path: Path) -> None:
    """From now on every progress line's global step is kept in `path` too."""
    _PROGRESS.path = path


def epoch_steps(left: int, every: int) -> int:
    """The steps of each epoch of a coordinator: `every`, or where no more are left, the largest
    divisor of them up to half. One epoch would log no rate (the first only starts the clock),
    and a divisor makes whole epochs of one fit: each fit more leaves its workers' input behind."""
    if left > every:
        return every
    return max((steps for steps in range(1, left // 2 + 1) if left % steps == 0), default=1)


class Throughput:
    """Counts this trainer's steps and examples, and logs its progress."""

    def __init__(self, every_steps: int, *, counts_examples: bool = True) -> None:
        self._every = every_steps
        self._counts_examples = counts_examples
        self._local_steps = 0
        self._examples = 0
        self._first: Mark | None = None
        self._window: Mark | None = None
        self._last: Mark | None = None

    def due(self, global_step: int) -> bool:
        """Whether a step that ends at `global_step` is the first or may bring a line (where a
        caller's loss read waits for the step, it reads only then)."""
        if self._window is None:
            return True
        return global_step // self._every > self._window.global_step // self._every

    def step(
        self, global_step: int, examples: int, loss: float | None, *, steps: int = 1
    ) -> Rates | None:
        """Records `steps` steps of this trainer ending at `global_step`; returns the rates it
        logged, None where no line was due."""
        self._local_steps += steps
        self._examples += examples
        mark = Mark(time.monotonic(), self._local_steps, global_step, self._examples)
        if self._first is None:
            self._first = self._window = mark
            # Steps counted in bulk (a coordinator's epoch) have a loss worth saying; their
            # rate, start-up in it, is not.
            over = "" if steps == 1 or loss is None else f": loss {loss:.4g} over its {steps} steps"
            logging.info("first step done (global step %d)%s", global_step, over)
            _keep_progress(global_step)
            return None
        self._last = mark
        assert self._window is not None
        if not self.due(global_step) or mark.seconds <= self._window.seconds:
            return None
        rates = self._rates(self._window, mark)
        per_sec = rates.examples_per_sec
        logging.info(
            "step %d: %s%s%.2f global steps/s",
            global_step,
            "" if loss is None else f"loss {loss:.4g}, ",
            "" if per_sec is None else f"{per_sec:.1f} examples/s, ",
            rates.global_steps_per_sec,
        )
        self._window = mark
        _keep_progress(global_step)
        return rates

    def end(self) -> Rates | None:
        """Logs the last step's line; returns the mean rates, None for a run too short."""
        examples = self.mean_examples_per_sec()
        logging.info(
            "last step done after %d steps here; mean %s examples/s",
            self._local_steps,
            "-" if examples is None else f"{examples:.1f}",
        )
        return self.mean()

    @property
    def global_step(self) -> int | None:
        """The global step after this trainer's latest step, None before its first."""
        latest = self._last or self._first
        return None if latest is None else latest.global_step

    def mean(self) -> Rates | None:
        """The rates from the second step to the last; None if the run was too short."""
        if self._first is None or self._last is None or self._last.seconds <= self._first.seconds:
            return None
        return self._rates(self._first, self._last)

    def mean_examples_per_sec(self) -> float | None:
        mean = self.mean()
        return None if mean is None else mean.examples_per_sec

    def _rates(self, since: Mark, until: Mark) -> Rates:
        seconds = until.seconds - since.seconds
        return Rates(
            (until.examples - since.examples) / seconds if self._counts_examples else None,
            (until.global_step - since.global_step) / seconds,
        )


def _keep_progress(global_step: int) -> None:
    """Keeps `global_step` in the run's progress.json, where this process keeps one."""
    if _PROGRESS.path is not None:
        # Training goes on where the file cannot be written (a full disk, say).
        with contextlib.suppress(OSError):
            reports.write_json_atomically(
                _PROGRESS.path, {"global_step": global_step, "time": time.time()}
            )


class LossSinceLastLine:
    """The loss a progress line says, from Keras's fit, whose logs give the running mean of
    the loss since the epoch began: the mean over the steps since the last line instead."""

    def __init__(self) -> None:
        # (global step, the running mean times the batches it covers) at the last line.
        self._since: tuple[int, float] | None = None
        self._latest = (0, 0.0)

    def mean(self, step: int, running_mean: float, batches: int) -> float:
        """The mean loss since the last line, from fit's `running_mean` over `batches` to `step`."""
        total = running_mean * batches
        since_step, since_total = self._since or (step - 1, 0.0)
        if self._since is None:
            self._since = (step, total)
        self._latest = (step, total)
        return (total - since_total) / max(step - since_step, 1)

    def said(self) -> None:
        """A line has said the latest mean: the next one starts from there."""
        self._since = self._latest

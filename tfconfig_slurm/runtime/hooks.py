"""Session hooks the runtime adds to every trainer: throughput, logged and written as scalars."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf
from absl import logging

# A moment of the run: (monotonic time, local steps done, global step).
_Mark = tuple[float, int, int]


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Logs the loss, examples/s and global steps/s every `every_steps` local steps, as the
    HPC centres' scripts report training, and writes the speeds as scalars (Estimator writes
    the loss); at the end, the run's means. Estimator's own step lines are silenced."""

    def __init__(self, batch_size: int, summary_dir: str, every_steps: int) -> None:
        self._batch_size = batch_size
        self._summary_dir = summary_dir
        self._every_steps = every_steps
        self._writer: Any | None = None
        self._fetches: dict[str, Any] = {}
        self._local_steps = 0
        # The means leave the first step out: it includes building the session.
        self._first: _Mark | None = None
        self._window: _Mark | None = None
        self._last: _Mark | None = None

    def begin(self) -> None:
        self._fetches = {"step": tf.compat.v1.train.get_global_step()}
        # Estimator puts the EstimatorSpec's loss last in this collection, after any the
        # model_fn's tf.compat.v1.losses added.
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        if losses:
            self._fetches["loss"] = losses[-1]
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)

    def before_run(self, run_context: Any) -> tf.compat.v1.train.SessionRunArgs:
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._local_steps += 1
        results = run_values.results
        mark = (time.monotonic(), self._local_steps, int(results["step"]))
        if self._first is None:
            self._first = self._window = mark
            logging.info("first step done (global step %d)", mark[2])
            return
        self._last = mark
        assert self._window is not None
        if mark[1] - self._window[1] >= self._every_steps and mark[0] > self._window[0]:
            examples, steps = self._rates(self._window, mark)
            loss = f"loss {float(results['loss']):.4g}, " if "loss" in results else ""
            logging.info(
                "step %d: %s%.1f examples/s, %.2f global steps/s", mark[2], loss, examples, steps
            )
            self._record(examples, steps, mark[2])
            self._window = mark

    def end(self, session: Any) -> None:
        mean = self.mean_examples_per_sec()
        logging.info(
            "last step done after %d steps here; mean %s examples/s",
            self._local_steps,
            "-" if mean is None else f"{mean:.1f}",
        )
        if mean is not None:
            assert self._first is not None and self._last is not None
            self._record(*self._rates(self._first, self._last), self._last[2])
        if self._writer is not None:
            self._writer.flush()

    def mean_examples_per_sec(self) -> float | None:
        """Examples per second over the run, from the second step to the last; None if too short."""
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None
        return self._rates(self._first, self._last)[0]

    def _rates(self, since: _Mark, until: _Mark) -> tuple[float, float]:
        seconds = until[0] - since[0]
        return (
            (until[1] - since[1]) * self._batch_size / seconds,
            (until[2] - since[2]) / seconds,
        )

    def _record(self, examples_per_sec: float, global_steps_per_sec: float, step: int) -> None:
        assert self._writer is not None
        values = {
            "examples_per_sec": examples_per_sec,
            "global_steps_per_sec": global_steps_per_sec,
        }
        self._writer.add_summary(
            tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                    for tag, value in values.items()
                ]
            ),
            step,
        )

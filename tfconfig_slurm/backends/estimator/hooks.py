"""Session hooks the runtime adds to every trainer: throughput, logged and written as scalars.

The examples of a step are counted in the graph: the batch dimension of what the input
pipeline handed the step (the first tensor of Estimator's dataset iterator, or of a queue's
dequeue for the input functions that read queues), so that a user's script need not say its
batch size, and a last batch cut short counts for what it holds.
"""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf
from absl import logging

# A moment of the run: (monotonic time, local steps done, global step, examples done).
_Mark = tuple[float, int, int, int]
# Ops that hand a step its input, as Estimator's input functions build them.
_INPUT_OPS = ("IteratorGetNext", "QueueDequeueManyV2", "QueueDequeueUpToV2")


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Logs the loss, examples/s and global steps/s every `every_steps` local steps, as the
    HPC centres' scripts report training, and writes the speeds as scalars (Estimator writes
    the loss); at the end, the run's means. Estimator's own step lines are silenced."""

    def __init__(self, summary_dir: str, every_steps: int) -> None:
        self._summary_dir = summary_dir
        self._every_steps = every_steps
        self._writer: Any | None = None
        self._fetches: dict[str, Any] = {}
        self._local_steps = 0
        self._examples = 0
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
        batch = _batch_size()
        if batch is not None:
            self._fetches["examples"] = batch
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)

    def before_run(self, run_context: Any) -> tf.compat.v1.train.SessionRunArgs:
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._local_steps += 1
        results = run_values.results
        self._examples += int(results.get("examples", 0))
        mark = (time.monotonic(), self._local_steps, int(results["step"]), self._examples)
        if self._first is None:
            self._first = self._window = mark
            logging.info("first step done (global step %d)", mark[2])
            return
        self._last = mark
        assert self._window is not None
        if mark[1] - self._window[1] >= self._every_steps and mark[0] > self._window[0]:
            examples, steps = self._rates(self._window, mark)
            loss = f"loss {float(results['loss']):.4g}, " if "loss" in results else ""
            speed = f"{examples:.1f} examples/s, " if "examples" in self._fetches else ""
            logging.info("step %d: %s%s%.2f global steps/s", mark[2], loss, speed, steps)
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
        """Examples per second over the run, from the second step to the last; None if too
        short, or if the input's batch size could not be found."""
        if "examples" not in self._fetches:
            return None
        if self._first is None or self._last is None or self._last[0] <= self._first[0]:
            return None
        return self._rates(self._first, self._last)[0]

    def _rates(self, since: _Mark, until: _Mark) -> tuple[float, float]:
        seconds = until[0] - since[0]
        return (
            (until[3] - since[3]) / seconds,
            (until[2] - since[2]) / seconds,
        )

    def _record(self, examples_per_sec: float, global_steps_per_sec: float, step: int) -> None:
        assert self._writer is not None
        values = {"global_steps_per_sec": global_steps_per_sec}
        if "examples" in self._fetches:
            values["examples_per_sec"] = examples_per_sec
        self._writer.add_summary(
            tf.compat.v1.Summary(
                value=[
                    tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                    for tag, value in values.items()
                ]
            ),
            step,
        )


def _batch_size() -> tf.Tensor | None:
    """The number of examples in the step's input, or None where no input op is found."""
    for op in tf.compat.v1.get_default_graph().get_operations():
        if op.type in _INPUT_OPS:
            # Sparse components travel as variants; the batch dimension is a dense one's.
            dense = [tensor for tensor in op.outputs if tensor.dtype != tf.variant]
            if dense and dense[0].shape.rank:
                return tf.shape(dense[0], out_type=tf.int64)[0]
    return None

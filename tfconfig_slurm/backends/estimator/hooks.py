"""Session hooks the runtime adds to every trainer: throughput, logged and written as scalars;
and the chief's checkpoints, timed. A step's examples are counted in the graph, from its input's
batch dimension, so that a script need not say its batch size and a short batch counts as such."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from tfconfig_slurm.process.job.preemption import StopRequest
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.throughput import Rates, Throughput

# Ops that hand a step its input, as Estimator's input functions build them.
_INPUT_OPS = ("IteratorGetNext", "QueueDequeueManyV2", "QueueDequeueUpToV2")


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Feeds the runtime's throughput meter (process/task/throughput.py) from each step, and
    writes the speeds as scalars (Estimator writes the loss); at the end, the run's means."""

    def __init__(self, summary_dir: str, every_steps: int) -> None:
        self._summary_dir = summary_dir
        self._every_steps = every_steps
        self._writer: Any | None = None
        self._fetches: dict[str, Any] = {}
        self._meter = Throughput(every_steps)

    def begin(self) -> None:
        self._fetches = {"step": tf.compat.v1.train.get_global_step()}
        # Estimator puts the EstimatorSpec's loss last, after any tf.compat.v1.losses added.
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        if losses:
            self._fetches["loss"] = losses[-1]
        batch = _batch_size()
        if batch is not None:
            self._fetches["examples"] = batch
        self._meter = Throughput(self._every_steps, counts_examples=batch is not None)
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)

    def after_create_session(self, session: Any, coord: Any) -> None:
        hang_watch.began(int(session.run(self._fetches["step"])))

    def before_run(self, run_context: Any) -> tf.compat.v1.train.SessionRunArgs:
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        results = run_values.results
        step = int(results["step"])
        hang_watch.stepped(step)
        loss = float(results["loss"]) if "loss" in results else None
        rates = self._meter.step(step, int(results.get("examples", 0)), loss)
        if rates is not None:
            self._record(rates, step)

    def end(self, session: Any) -> None:
        hang_watch.paused()
        mean = self._meter.end()
        if mean is not None and self._meter.global_step is not None:
            self._record(mean, self._meter.global_step)
        if self._writer is not None:
            self._writer.flush()

    def mean_examples_per_sec(self) -> float | None:
        """Throughput.mean_examples_per_sec: None if too short, or the batch size unknown."""
        return self._meter.mean_examples_per_sec()

    def _record(self, rates: Rates, step: int) -> None:
        assert self._writer is not None
        values = {"global_steps_per_sec": rates.global_steps_per_sec}
        if rates.examples_per_sec is not None:
            values["examples_per_sec"] = rates.examples_per_sec
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


class CheckpointTimer(tf.compat.v1.train.CheckpointSaverListener):
    """Times each checkpoint the chief writes, for the stop before the time limit
    (process/job/preemption.py). The hang watch rests from a checkpoint to the next step: a
    single process's train_and_evaluate evaluates there."""

    def __init__(self, stop: StopRequest) -> None:
        self._stop = stop
        self._started = 0.0

    def before_save(self, session: Any, global_step_value: int) -> None:
        hang_watch.paused()
        self._started = time.monotonic()

    def after_save(self, session: Any, global_step_value: int) -> None:
        self._stop.checkpoint_written(global_step_value, time.monotonic() - self._started)

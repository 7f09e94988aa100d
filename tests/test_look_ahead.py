"""Batches read ahead of the step (process/task/keras_run.py): in order, placed, bounded in
how far ahead and in how many, an experiment's error raised where fit reads, and a thread
that ends where fit stopped early. No TensorFlow, no JAX."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from tests.cli import wait_until
from tfconfig_slurm.process.task import keras_run
from tfconfig_slurm.process.task.keras_run import LookAhead


def test_the_batches_come_placed_in_order_and_end_at_the_steps_left() -> None:
    """An endless generator, 5 steps left: fit's last call of several steps gets what is left."""
    ahead = LookAhead(itertools.count(), 5, lambda batch: ("placed", batch))
    assert list(ahead.batches()) == [("placed", index) for index in range(5)]


def test_reading_runs_ahead_of_the_step_by_a_few_batches_only() -> None:
    """Before fit reads any: the queue's AHEAD and the one that waits for room."""
    read: list[int] = []

    def counted() -> Iterator[int]:
        for index in itertools.count():
            read.append(index)
            yield index

    ahead = LookAhead(counted(), 1000, lambda batch: batch)
    assert wait_until(lambda: len(read) == keras_run.AHEAD + 1, 5)
    batches = ahead.batches()
    assert next(batches) == 0
    assert wait_until(lambda: len(read) == keras_run.AHEAD + 2, 5)
    assert len(read) == keras_run.AHEAD + 2
    ahead.close()


def test_an_error_of_the_experiment_s_data_is_raised_where_fit_reads() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("a corrupt record")

    batches = LookAhead(failing(), 10, lambda batch: batch).batches()
    assert next(batches) == 1
    with pytest.raises(ValueError, match="a corrupt record"):
        next(batches)


def test_a_fit_that_stopped_early_leaves_no_reading_thread_behind() -> None:
    """Stopped on a signal with batches still queued: the thread, waiting for room, ends."""
    before = threading.active_count()
    ahead = LookAhead(itertools.count(), 1000, lambda batch: batch)
    assert next(ahead.batches()) == 0
    ahead.close()
    assert wait_until(lambda: threading.active_count() == before, 5)

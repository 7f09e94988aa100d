"""When a Keras run checkpoints (process/task/cadence.py): by steps or by time, whichever comes
first where neither flag is given, else by the one given alone. No TensorFlow."""

from __future__ import annotations

import time

import pytest

from tfconfig_slurm.process.task import cadence
from tfconfig_slurm.process.task.cadence import CheckpointCadence


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_by_default_a_checkpoint_comes_by_steps_or_by_time_whichever_first(
    clock: list[float],
) -> None:
    every = CheckpointCadence.of(None, None)
    assert every.by_steps(999, 1000) and not every.by_steps(1000, 1999)
    assert not every.by_time()
    clock[0] += cadence.DEFAULT_CHECKPOINT_SECONDS
    assert every.by_time()
    every.saved()
    assert not every.by_time()


def test_a_flag_given_alone_is_the_only_cadence(clock: list[float]) -> None:
    steps = CheckpointCadence.of(20, None)
    clock[0] += 10 * cadence.DEFAULT_CHECKPOINT_SECONDS
    assert steps.by_steps(19, 21) and not steps.by_time()
    seconds = CheckpointCadence.of(None, 30)
    assert not seconds.by_steps(999, 1000)
    assert not seconds.by_time()
    clock[0] += 30
    assert seconds.by_time()

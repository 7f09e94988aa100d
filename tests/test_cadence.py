"""When a Keras run checkpoints (process/task/keras_run.py): by steps or by time, whichever comes
first where neither flag is given, else by the one given alone; and what follows a Keras
trainer's step, agreed by its cluster's trainers. No TensorFlow."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.task import keras_run
from tfconfig_slurm.process.task.keras_run import CheckpointCadence, StepEnd, StepEnds
from tfconfig_slurm.process.task.lifecycle import TrainingSettings


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_by_default_a_checkpoint_comes_by_steps_or_by_time_whichever_first(
    clock: list[float],
) -> None:
    every = CheckpointCadence(None, None)
    assert every.by_steps(999, 1000) and not every.by_steps(1000, 1999)
    assert not every.by_time()
    clock[0] += keras_run.DEFAULT_CHECKPOINT_SECONDS
    assert every.by_time()
    every.saved()
    assert not every.by_time()


def test_a_flag_given_alone_is_the_only_cadence(clock: list[float]) -> None:
    steps = CheckpointCadence(20, None)
    clock[0] += 10 * keras_run.DEFAULT_CHECKPOINT_SECONDS
    assert steps.by_steps(19, 21) and not steps.by_time()
    seconds = CheckpointCadence(None, 30)
    assert not seconds.by_steps(999, 1000)
    assert not seconds.by_time()
    clock[0] += 30
    assert seconds.by_time()


def settings(save_steps: int | None) -> TrainingSettings:
    return TrainingSettings(
        model_dir=Path("."), train_steps=100, eval_steps=None, params={},
        save_checkpoints_steps=save_steps, save_checkpoints_secs=None, keep_checkpoint_max=5,
        intra_op_threads=0, inter_op_threads=0, gpu_memory_growth=False,
        gpu_memory_fraction=None, log_every_steps=10, sync_replicas=False,
    )  # fmt: skip


def test_a_single_trainer_stops_and_saves_at_the_step_its_signal_came() -> None:
    stop = preemption.StopRequest()
    ends = StepEnds(settings(20), stop, {"SIGUSR1"}, None)
    assert ends.after(18, 19) == StepEnd(save=False, stop_on="")
    assert ends.after(19, 20) == StepEnd(save=True, stop_on="")
    stop.ask("SIGTERM")
    assert ends.after(20, 21) == StepEnd(save=True, stop_on="SIGTERM")


def test_trainers_agree_at_every_tenth_step_and_a_peer_s_requeue_stands_for_all(
    clock: list[float],
) -> None:
    """The votes: stop, requeue, a checkpoint due by time, each summed over the trainers."""
    asked: list[Sequence[int]] = []
    peers = [0, 0, 0]

    def sum_votes(own: Sequence[int]) -> Sequence[float]:
        asked.append(own)
        return [mine + theirs for mine, theirs in zip(own, peers)]

    stop = preemption.StopRequest()
    stop.ask("SIGTERM")
    ends = StepEnds(settings(None), stop, {"SIGUSR1"}, sum_votes)
    # Told, but not at a tenth step: nothing is asked of the others, nothing done.
    assert ends.after(11, 12) == StepEnd(save=False, stop_on="")
    assert asked == []
    assert ends.after(19, 20) == StepEnd(save=True, stop_on="SIGTERM")
    assert asked == [[1, 0, 0]]
    # A peer was told to requeue: every trainer stops on the requeueing signal.
    peers[:] = [1, 1, 0]
    assert ends.after(29, 30) == StepEnd(save=True, stop_on="SIGUSR1")
    # Not told itself, a peer's checkpoint due by its clock is due here too.
    quiet_stop = preemption.StopRequest()
    quiet = StepEnds(settings(None), quiet_stop, {"SIGUSR1"}, sum_votes)
    peers[:] = [0, 0, 1]
    assert quiet.after(39, 40) == StepEnd(save=True, stop_on="")
    peers[:] = [1, 0, 0]
    assert quiet.after(49, 50) == StepEnd(save=True, stop_on="a peer's signal")
    assert quiet_stop.said("a peer's signal") == "a peer's signal"
    # Its own SIGTERM come after the agreement (sent to every task): the stop's end names it,
    # and a stop agreed on by its own name stays so.
    quiet_stop.ask("SIGTERM")
    assert quiet_stop.said("a peer's signal") == "SIGTERM"
    assert quiet_stop.said("SIGUSR1") == "SIGUSR1"

"""A supervised task's state (process/supervision/task_state.py): it only moves on, the first
stopping signal is the one said, and its end is taken once. No TensorFlow."""

from __future__ import annotations

import signal
import threading

from tfconfig_slurm.process.supervision.task_state import LostPeer, State, TaskState


def test_a_task_runs_stops_on_its_first_signal_and_keeps_it() -> None:
    state = TaskState()
    seen = [state.state]
    state.running()
    seen.append(state.state)
    state.told_to_stop(signal.SIGTERM)
    state.told_to_stop(signal.SIGINT)
    seen.append(state.state)
    state.running()  # a stop is not undone
    seen.append(state.state)
    assert seen == [State.STARTING, State.RUNNING, State.STOPPING, State.STOPPING]
    assert state.stopped_by is signal.SIGTERM


def test_the_end_is_taken_once_and_a_signal_after_it_leaves_it_as_it_was() -> None:
    state = TaskState()
    state.running()
    peer = LostPeer("ps 0", "node1:2222", 4.0)
    assert state.take_end(State.LOST, peer)
    # The main thread, whose command the watch killed, comes second: the end stays the watch's.
    assert not state.take_end(State.FAILED)
    state.told_to_stop(signal.SIGTERM)
    state.finished()
    assert (state.state, state.lost, state.stopped_by) == (State.LOST, peer, signal.SIGTERM)


def test_of_threads_that_end_the_task_at_once_exactly_one_takes_it() -> None:
    state = TaskState()
    start = threading.Barrier(8)
    taken: list[bool] = []

    def end(number: int) -> None:
        start.wait()
        taken.append(state.take_end(State.LOST, LostPeer(f"worker {number}", "n:1", 3.0)))

    threads = [threading.Thread(target=end, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == [False] * 7 + [True]
    assert state.lost is not None and state.state is State.LOST

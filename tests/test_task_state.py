"""A supervised task's state (process/supervision/supervise.py's TaskState): it only moves on,
the first stopping signal is the one said, and its end is taken once, by a watch or by the main
thread as it closes it. No TensorFlow."""

from __future__ import annotations

import signal
import threading

from tfconfig_slurm.process.supervision.supervise import LostPeer, State, TaskState


def test_a_task_stops_on_its_first_signal_and_closes_done() -> None:
    state = TaskState()
    seen = [state.state]
    state.told_to_stop(signal.SIGTERM)
    state.told_to_stop(signal.SIGINT)
    seen.append(state.state)
    assert state.close()
    seen.append(state.state)
    assert seen == [State.RUNNING, State.STOPPING, State.DONE]
    assert state.stopped_by is signal.SIGTERM
    # Closed, it takes no end: a watch's loss found after the main thread left is none.
    assert not state.take_end(State.LOST, LostPeer("ps 0", "node1:2222", 4.0))
    assert state.lost is None


def test_a_watch_s_end_is_taken_once_and_the_main_thread_is_told_as_it_closes() -> None:
    state = TaskState()
    peer = LostPeer("ps 0", "node1:2222", 4.0)
    assert state.take_end(State.LOST, peer)
    # The main thread, whose command the watch killed, comes second: the end stays the watch's.
    assert not state.take_end(State.FAILED)
    state.told_to_stop(signal.SIGTERM)
    assert not state.close()
    assert (state.state, state.lost, state.stopped_by) == (State.LOST, peer, signal.SIGTERM)


def test_a_failure_the_main_thread_took_closes_as_it_was() -> None:
    state = TaskState()
    assert state.take_end(State.FAILED)
    assert state.close()
    assert state.state is State.FAILED


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

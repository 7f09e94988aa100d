"""The state of a task that with-tfconfig supervises, explicit, and only ever moving on:
starting, running, stopping (told to, by a signal), and how it ended: done, failed (its
command), or lost (a peer it watched).

The supervisor's threads move it: its main thread (the command started, and ended), its signal
handler (told to stop), and the watches of its peers (one lost). The end of a task that fails
is taken once (take_end): by a watch that lost a peer, which then kills the command, or by the
main thread, whose command failed. The main thread ends the process either way, as the state
says, and a watch that comes second leaves it to do so. No TensorFlow here.
"""

from __future__ import annotations

import enum
import signal
import threading
from typing import NamedTuple


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    LOST = "lost"


class LostPeer(NamedTuple):
    """The peer whose loss ends the task, as its watch found it."""

    name: str
    address: str
    # 0: it said its command failed.
    silent_for: float


class TaskState:
    """A supervised task's state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress = State.STARTING
        # Kept apart from the progress, which the signal handler moves without the lock.
        self._end: State | None = None
        self._stopped_by: signal.Signals | None = None
        self._lost: LostPeer | None = None

    @property
    def state(self) -> State:
        return self._end or self._progress

    @property
    def stopped_by(self) -> signal.Signals | None:
        """The first stopping signal the task was sent, if any."""
        return self._stopped_by

    @property
    def lost(self) -> LostPeer | None:
        """The peer whose loss ended the task, once a watch has taken its end."""
        return self._lost

    def running(self) -> None:
        if self._progress is State.STARTING:
            self._progress = State.RUNNING

    def told_to_stop(self, signum: signal.Signals) -> None:
        """A stopping signal came. Called from the signal handler, it takes no lock: the main
        thread it interrupts may hold it. The first signal is the one to say."""
        if self._stopped_by is None:
            self._stopped_by = signum
        if self._progress in (State.STARTING, State.RUNNING):
            self._progress = State.STOPPING

    def finished(self) -> None:
        """The command exited 0."""
        self._progress = State.DONE

    def take_end(self, state: State, lost: LostPeer | None = None) -> bool:
        """Takes the end of the task as `state` (FAILED, or LOST with the peer): True for
        the first caller, which ends the task; False where another has taken it."""
        with self._lock:
            if self._end is not None:
                return False
            self._end, self._lost = state, lost
        return True

"""The state of a task that with-tfconfig supervises, explicit, and only ever moving on:
running, stopping (told to, by a signal), and how it ended: done, failed (its command), or
lost (a peer it watched).

The supervisor's threads move it: its main thread (its command ended), its signal handler
(told to stop), and the watches of its peers (one lost). The end is taken once: by a watch
that lost a peer (take_end), which then kills the command; by the main thread, whose command
failed; or by the main thread as it returns (close), after which a watch takes nothing. The
main thread ends the task as the state says; a watch that comes second leaves it to do so.
No TensorFlow here.
"""

from __future__ import annotations

import enum
import signal
import threading
from typing import NamedTuple

from tfconfig_slurm.process.job.preemption import StopRequest


class State(enum.Enum):
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
    """A supervised task's state, from its command's start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Kept apart from the end, as the signal handler notes it without the lock.
        self._stop = StopRequest()
        self._end: State | None = None
        self._lost: LostPeer | None = None

    @property
    def state(self) -> State:
        return self._end or (State.STOPPING if self._stop.requested else State.RUNNING)

    @property
    def stopped_by(self) -> signal.Signals | None:
        """The first stopping signal the task was sent, if any."""
        return self._stop.signum

    @property
    def lost(self) -> LostPeer | None:
        """The peer whose loss ended the task, once a watch has taken its end."""
        return self._lost

    def told_to_stop(self, signum: signal.Signals) -> None:
        """A stopping signal came. Called from the signal handler, it takes no lock: the main
        thread it interrupts may hold it. The first signal is the one to say."""
        self._stop.note(signum.name)

    def take_end(self, state: State, lost: LostPeer | None = None) -> bool:
        """Takes the end of the task as `state` (FAILED, or LOST with the peer): True for
        the first caller, which ends the task; False where it is taken or closed already."""
        with self._lock:
            if self._end is not None:
                return False
            self._end, self._lost = state, lost
        return True

    def close(self) -> bool:
        """The main thread's last word, as it leaves with its command's status: from now on a
        watch takes no end. False where a watch took it first (a peer lost): the main
        thread ends the task for that instead."""
        with self._lock:
            if self._end is None:
                self._end = State.DONE
            return self._end is not State.LOST

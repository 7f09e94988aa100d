"""The state of a task that with-tfconfig supervises, only ever moving on: running, stopping
(by a signal), then done, failed (its command) or lost (a peer). The end is taken once: by a
watch that lost a peer, or by the main thread, whose command failed or which returns."""

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
        """A stopping signal came; the first is the one to say. No lock: called from the signal
        handler, whose interrupted main thread may hold it."""
        self._stop.note(signum.name)

    def take_end(self, state: State, lost: LostPeer | None = None) -> bool:
        """Takes the task's end as `state` (FAILED, or LOST with the peer); True if first."""
        with self._lock:
            if self._end is not None:
                return False
            self._end, self._lost = state, lost
        return True

    def close(self) -> bool:
        """The main thread's last word: from now on a watch takes no end. False where a watch
        lost a peer first, for which the main thread then ends the task."""
        with self._lock:
            if self._end is None:
                self._end = State.DONE
            return self._end is not State.LOST

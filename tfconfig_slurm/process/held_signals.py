"""The stop signals that come before a task listens for them, held from the entry's first line.

SIGUSR1's and SIGTERM's default action ends the process, and a task imports for a second or
more before it can listen (seconds, with a node's tasks all starting at once): a job told to
stop then had its step's tasks killed by the signal, and it was neither requeued nor restarted.
Held here, such a signal is handed to the task's stop request once it listens, or, where the
task does not listen for it, acted on as it would have been. The window before the entry's
first line closes where the task starts with them blocked (launch/train.sbatch).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection
from types import FrameType

HELD = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
_came: list[signal.Signals] = []
_holding: list[signal.Signals] = []


def hold() -> None:
    """From now on, each of HELD is noted until `release`; call it before anything slow."""

    def note(number: int, frame: FrameType | None) -> None:
        _came.append(signal.Signals(number))

    for signum in HELD:
        signal.signal(signum, note)
    _holding[:] = HELD
    # Started with them blocked (launch/train.sbatch), those that came meanwhile are noted now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def release(listened: Collection[signal.Signals | None]) -> list[signal.Signals]:
    """The held signals that came and are among `listened`, whose handlers the caller has
    installed; each other held signal goes back to its default action, and one that came is
    delivered again, to end the process as it would have. Nothing where none were held."""
    if not _holding:
        return []
    came = list(dict.fromkeys(_came))
    for signum in _holding:
        if signum not in listened:
            signal.signal(signum, signal.SIG_DFL)
    _holding.clear()
    for signum in came:
        if signum not in listened:
            os.kill(os.getpid(), signum)
    return [signum for signum in came if signum in listened]

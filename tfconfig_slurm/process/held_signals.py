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
from collections.abc import Callable, Collection
from types import FrameType
from typing import Any

HELD = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
_came: list[signal.Signals] = []
# Each held signal's handler before `hold`, for `release` to give back.
_before: dict[signal.Signals, signal.Handlers | Callable[..., Any] | int | None] = {}


def hold() -> None:
    """From now on, each of HELD is noted until `release`; call it before anything slow."""

    def note(number: int, frame: FrameType | None) -> None:
        _came.append(signal.Signals(number))

    for signum in HELD:
        _before[signum] = signal.signal(signum, note)
    # Started with them blocked (launch/train.sbatch), those that came meanwhile are noted now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def release(listened: Collection[signal.Signals | None]) -> list[signal.Signals]:
    """The held signals that came and are among `listened`, whose handlers the caller has
    installed; each other held signal gets its handler back, and one that came while that was
    the default action is delivered again, to end the process as it would have. Nothing where
    none were held."""
    for signum, handler in _before.items():
        if signum not in listened:
            signal.signal(signum, handler)
    # Read once no handler of this module's can add to it.
    came = list(dict.fromkeys(_came))
    for signum in came:
        if signum not in listened and _before[signum] == signal.SIG_DFL:
            os.kill(os.getpid(), signum)
    _before.clear()
    return [signum for signum in came if signum in listened]

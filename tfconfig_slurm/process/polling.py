"""Waiting for what another process writes or says: a read repeated until it is done."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from tfconfig_slurm.process import timing

_T = TypeVar("_T")


def poll(
    read: Callable[[], _T],
    done: Callable[[_T], bool],
    seconds: float,
    every: float = timing.POLL_SECONDS,
) -> _T:
    """Reads every `every` seconds until `done` holds or `seconds` pass; the last value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(every)

"""Waiting for what another process writes or says: a read repeated until it is done. No
TensorFlow here."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

POLL_SECONDS = 0.1

_T = TypeVar("_T")


def poll(
    read: Callable[[], _T], done: Callable[[_T], bool], seconds: float, every: float = POLL_SECONDS
) -> _T:
    """Reads every `every` seconds until `done` holds or `seconds` pass; returns the last
    value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(every)

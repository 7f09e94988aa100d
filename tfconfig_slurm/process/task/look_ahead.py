"""Batches read ahead of the step that trains on them, on a thread of their own, at most the
steps left: a backend's work on a batch (the experiment's gather or decode, the copy to the
devices) then runs while the devices take the step before, where a plain fit does it on the
training thread between the steps it dispatches. No TensorFlow, no JAX: the backend says how
a batch is placed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

# Batches read ahead of the step that trains: enough for the next step's while one runs, and
# little memory (each holds one batch of the process's share).
AHEAD = 2
_END = object()
# How long close() waits for the reading thread, inside the experiment's generator for a batch
# at most: one that blocks for ever is the hang watch's to find, not this wait's.
_CLOSE_SECONDS = 10.0


class LookAhead:
    """At most `steps` of `batches`, each `placed`, read ahead on a thread; `batches()` gives
    them in order (a generator, which is what Keras's adapters take); close() leaves the
    thread to end."""

    def __init__(self, batches: Iterator[Any], steps: int, placed: Callable[[Any], Any]) -> None:
        self._ahead: queue.Queue[Any] = queue.Queue(AHEAD)
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(batches, steps, placed), name="batches ahead", daemon=True
        )
        self._thread.start()

    def batches(self) -> Iterator[Any]:
        """The batches in order; an error the experiment's generator raised, raised here."""
        while True:
            batch = self._ahead.get()
            if batch is _END:
                return
            if isinstance(batch, BaseException):
                raise batch
            yield batch

    def close(self) -> None:
        """Ends the reading thread at its next batch (a fit that stopped early leaves it
        waiting for room), and waits a while for it: the evaluation's batches come next, from
        the same experiment, whose generators may share state."""
        self._closed.set()
        self._drain()
        self._thread.join(timeout=_CLOSE_SECONDS)
        self._drain()

    def _drain(self) -> None:
        while not self._ahead.empty():
            self._ahead.get_nowait()

    def _read(self, batches: Iterator[Any], steps: int, placed: Callable[[Any], Any]) -> None:
        try:
            for _, batch in zip(range(steps), batches):
                if not self._put(placed(batch)):
                    return
            self._put(_END)
        except BaseException as error:
            # Raised again on the training thread, as fit reads the batch it stands for.
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not self._closed.is_set():
            try:
                self._ahead.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

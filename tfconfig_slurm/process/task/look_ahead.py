"""Batches read ahead of the step that trains on them, on a thread of their own: a backend's work
on a batch (decoding, the copy to the devices) runs while the devices take the step before,
not between steps. No TensorFlow, no JAX: the backend says how a batch is placed."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

# Enough for the next step's while one runs, in little memory.
AHEAD = 2
_END = object()
# close()'s wait for the reading thread: a generator that blocks for ever is the hang watch's.
_CLOSE_SECONDS = 10.0


class LookAhead:
    """At most `steps` of `batches`, each `placed`, read ahead; `batches()` gives them in order
    (a generator, as Keras's adapters take)."""

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
        """Ends the reading thread (a fit that stopped early leaves it waiting for room) and waits
        a while: the evaluation's batches come next, from generators that may share state."""
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

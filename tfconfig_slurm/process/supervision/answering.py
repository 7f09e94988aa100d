"""The port a task answers on for its watchers (watchdog.py) while it has no server of its
own there: a with-tfconfig supervisor, a Keras 3 process (JAX listens only on the chief's).
The kernel completes a watcher's connection; the answer says alive (WAITING), FINISHED or
FAILED."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from absl import logging

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.supervision import watchdog

# The answers of the port this process serves, while a block of answering holds it: a block
# within it (a trainer saying WAITING finds a child lost, and says FAILED) changes what the port
# answers, as it could not bind the port a second time.
_SERVING: list[list[bytes]] = []


@contextlib.contextmanager
def answering(role: ClusterRole) -> Iterator[list[bytes]]:
    """Within the block, this task's port (free again) answers the last of the list it yields
    (WAITING at first: alive, not finished)."""
    if _SERVING:
        yield _SERVING[-1]
        return
    port = int(role.address.rpartition(":")[2])
    answer = [watchdog.WAITING]
    try:
        listener = socket.create_server(("0.0.0.0", port), reuse_port=False)
    except OSError as error:
        logging.warning(
            "%s %d cannot answer on its port %d (%s): its watchers will take it for lost",
            role.role,
            role.index,
            port,
            error.strerror,
        )
        yield answer
        return
    stopped = threading.Event()
    threading.Thread(target=_answer, args=(listener, stopped, answer), daemon=True).start()
    _SERVING.append(answer)
    try:
        yield answer
    finally:
        _SERVING.remove(answer)
        stopped.set()
        listener.close()


def _answer(listener: socket.socket, stopped: threading.Event, answer: list[bytes]) -> None:
    while not stopped.is_set():
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with contextlib.suppress(OSError), connection:
            connection.sendall(answer[-1])

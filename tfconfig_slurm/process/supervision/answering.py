"""The port a task answers on for its watchers (watchdog.py) while it has no server of its
own there: a with-tfconfig supervisor, a Keras 3 process (JAX listens only on the chief's)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from absl import logging

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.supervision import watchdog

# The answers of the port this process serves: a block within another changes what the port
# answers (WAITING to FAILED, say), as it cannot bind the port a second time.
_SERVING: list[list[bytes]] = []
# Held while _SERVING is looked at and the port bound: once_free's thread binds it too.
_BINDING = threading.Lock()


@contextlib.contextmanager
def answering(role: ClusterRole) -> Iterator[list[bytes]]:
    """Within the block, this task's port answers the last of the list it yields (WAITING)."""
    with _BINDING:
        serving = _SERVING[-1] if _SERVING else None
        listener, problem = None, ""
        if serving is None:
            try:
                listener = _bound(role)
            except OSError as error:
                problem = error.strerror or str(error)
    if serving is not None:
        yield serving
        return
    answer = [watchdog.WAITING]
    if listener is None:
        logging.warning(
            "%s %d cannot answer on its port %d (%s): its watchers will take it for lost",
            role.role,
            role.index,
            _port(role),
            problem,
        )
    with contextlib.nullcontext() if listener is None else _served(listener, answer):
        yield answer


@contextlib.contextmanager
def once_free(role: ClusterRole) -> Iterator[None]:
    """Within the block, this task's port answers WAITING once the command's own server there
    has closed it: a --keras3 chief's JAX service shuts down seconds before its process ends."""
    stopped = threading.Event()
    held = contextlib.ExitStack()

    def take_over() -> None:
        while not watchdog.answers(f"127.0.0.1:{_port(role)}"):
            if stopped.wait(timing.PROBE_SECONDS / 4):
                return
        while not stopped.wait(_TAKE_OVER_SECONDS):
            with _BINDING:
                if _SERVING:
                    return
                with contextlib.suppress(OSError):
                    held.enter_context(_served(_bound(role), [watchdog.WAITING]))
                    return

    thread = threading.Thread(target=take_over, name="port once free", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()
        held.close()


# How often once_free tries to bind a port its command's server holds.
_TAKE_OVER_SECONDS = 0.05


def _port(role: ClusterRole) -> int:
    return int(role.address.rpartition(":")[2])


def _bound(role: ClusterRole) -> socket.socket:
    return socket.create_server(("0.0.0.0", _port(role)), reuse_port=False)


@contextlib.contextmanager
def _served(listener: socket.socket, answer: list[bytes]) -> Iterator[None]:
    """`listener` answers the last of `answer` until the block ends."""
    stopped = threading.Event()
    threading.Thread(target=_answer, args=(listener, stopped, answer), daemon=True).start()
    _SERVING.append(answer)
    try:
        yield
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

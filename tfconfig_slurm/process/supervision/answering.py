"""The port a task answers on for its watchers (watchdog.py) while it has no server of its
own there: a with-tfconfig supervisor, a Keras 3 process (JAX listens only on the chief's), a
task that failed or refused its input at its start (say_failed). The kernel completes a
watcher's connection; the answer says alive (WAITING), FINISHED or FAILED."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from absl import logging

from tfconfig_slurm.cluster.layout import EVALUATOR
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process import timing
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


def say_failed(role: ClusterRole, why: str) -> None:
    """Says why this task ends, and answers FAILED on its port long enough for every watcher
    to probe it twice: a task that died before its server listened would otherwise be waited
    for as one still starting (timing.START_SECONDS). A task alone in its cluster, or an
    evaluator (outside it, with no port), has no watcher to tell, and returns at once."""
    alone = sum(map(len, role.cluster.values())) == 1 and not role.has_evaluator
    if alone or role.role == EVALUATOR:
        logging.error("%s %d: %s; exiting", role.role, role.index, why)
        return
    seconds = 2 * watchdog.round_seconds(max(role.ps_count, 1)) + timing.LOST_AFTER_SECONDS
    logging.error(
        "%s %d: %s; saying so on its port for %.0f s, then exiting",
        role.role,
        role.index,
        why,
        seconds,
    )
    with answering(role) as answer:
        answer.append(watchdog.FAILED)
        time.sleep(seconds)


def _answer(listener: socket.socket, stopped: threading.Event, answer: list[bytes]) -> None:
    while not stopped.is_set():
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with contextlib.suppress(OSError), connection:
            connection.sendall(answer[-1])

"""with-tfconfig's supervision of its command: the runtime's guarantees for a script that knows
nothing of them.

The command runs as a child, with its task's environment. Signals sent to the supervisor are
passed on to it, and its exit status comes back out (128 + N for a child a signal ended). The
child dies with the supervisor (PR_SET_PDEATHSIG), so no task outlives its srun. Around it,
by role:

- A trainer (chief, worker) watches every parameter server: one that stops answering while
  the trainer trains ends it, by name, with exit status 3 (watchdog.py). When its command
  exits 0 the trainer says so on its own port, free again, with FINISHED until the
  parameter servers have gone: the command finished, it did not crash. A trainer whose
  command failed leaves with its status and says nothing; its port falls silent, and the
  parameter servers take it for lost.
- A parameter server watches every trainer. A stock Estimator or TF2 parameter server never
  returns (`server.join()`): once every trainer has said FINISHED, its command is ended and
  the task exits 0. A trainer lost first ends it with exit status 3, by name.
- An evaluator is only supervised.

No TensorFlow here: processes, signals and sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF, PS, WORKER
from tfconfig_slurm.runtime import watchdog
from tfconfig_slurm.runtime.role import ClusterRole

# The signals a supervisor passes on to its command.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
)
# How long a parameter server's command, once every trainer has finished, has to end on
# SIGTERM before it is killed.
_END_GRACE_SECONDS = 5.0
# How long a finished trainer says so at most, should a parameter server never leave; at
# least three of a parameter server's rounds of probes.
_FINISHED_SECONDS = 60.0
_PR_SET_PDEATHSIG = 1

Child = subprocess.Popen[bytes]


def start(program: str, command: Sequence[str], environment: dict[str, str]) -> Child:
    """Starts the command (`program` is its first word, found); raises OSError if it cannot."""
    # preexec_fn is unsafe only once threads run, and none does yet.
    return subprocess.Popen(
        list(command),
        executable=program,
        env=environment,
        preexec_fn=_die_with_parent,  # noqa: PLW1509
    )


def supervise(child: Child, role: ClusterRole) -> int:
    """Runs the started command as `role`'s task to its end; the exit status to leave with."""
    for signum in FORWARDED:
        signal.signal(signum, lambda number, frame: _forward(child, number))

    def lost(name: str, address: str, silent_for: float) -> None:
        child.kill()
        watchdog.exit_on_lost(name, address, silent_for)

    if role.role == PS:
        return _serve_until_trainers_finish(child, role, lost)
    if role.role in (CHIEF, WORKER) and role.ps_count:
        peers = watchdog.PeerWatch(role.named(PS), on_lost=lost)
        status = _status(child.wait())
        peers.stop()
        if status == 0:
            _say_finished(role)
        return status
    return _status(child.wait())


def _serve_until_trainers_finish(child: Child, role: ClusterRole, lost: watchdog.OnLost) -> int:
    finished: list[str] = []
    everyone = threading.Event()

    def on_finished(name: str) -> None:
        finished.append(name)
        logging.info(
            "ps %d: %s finished (%d of %d)", role.index, name, len(finished), role.trainers
        )
        if len(finished) == role.trainers:
            everyone.set()

    trainers = watchdog.PeerWatch(role.named(CHIEF, WORKER), on_lost=lost, on_finished=on_finished)
    while child.poll() is None and not everyone.wait(0.2):
        pass
    trainers.stop()
    if child.poll() is not None:
        return _status(child.wait())
    logging.info(
        "ps %d: every trainer finished; ending its command (a parameter server's server.join() "
        "never returns)",
        role.index,
    )
    child.terminate()
    try:
        child.wait(timeout=_END_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    return 0


def _say_finished(role: ClusterRole) -> None:
    """Answers FINISHED on this trainer's port until no parameter server answers any more."""
    port = int(role.address.rpartition(":")[2])
    try:
        listener = socket.create_server(("0.0.0.0", port), reuse_port=False)
    except OSError as error:
        logging.warning(
            "%s %d finished, but cannot say so on port %d (%s): the parameter servers will "
            "take it for lost",
            role.role,
            role.index,
            port,
            error.strerror,
        )
        return
    stopped = threading.Event()
    threading.Thread(target=_answer, args=(listener, stopped), daemon=True).start()
    servers = role.named(PS)
    # Long enough for a parameter server watching every trainer to probe this one.
    lasts = max(_FINISHED_SECONDS, 3 * watchdog.round_seconds(role.trainers))
    deadline = time.monotonic() + lasts
    while time.monotonic() < deadline and any(map(watchdog.answers, servers.values())):
        time.sleep(watchdog.PROBE_SECONDS)
    stopped.set()
    listener.close()


def _answer(listener: socket.socket, stopped: threading.Event) -> None:
    while not stopped.is_set():
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        with contextlib.suppress(OSError), connection:
            connection.sendall(watchdog.FINISHED)


def _forward(child: Child, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signum)


def _status(returncode: int) -> int:
    """A shell's exit status for a child's return code: 128 + N for a child signal N ended."""
    return 128 - returncode if returncode < 0 else returncode


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

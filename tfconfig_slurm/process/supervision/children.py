"""The commands a supervisor runs, as one group: each dies with the supervisor (none outlives
one killed outright), signalled together, stopped with a grace period."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Callable

from tfconfig_slurm.process.supervision.command_output import Relay

Child = subprocess.Popen[str]
Handler = Callable[[int, "FrameType | None"], None]

# What ends a supervisor, as it would any process: scancel, a shell's Ctrl-C, a hang-up.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What its commands act on themselves (`--signal=USR1@90`, a time limit's stop), and a quit.
PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1
# Looked up before any fork: the child only calls them.
_LIBC = ctypes.CDLL(None, use_errno=True)
_PRCTL = _LIBC.prctl
# libc's signal(), with SIG_DFL (0): Python's signal.signal may be called from the main thread
# only, and the child of a fork is not Python's main thread where another thread forked it.
_SIGNAL = _LIBC.signal
_SIGNAL.argtypes = (ctypes.c_int, ctypes.c_void_p)
_SIGNAL.restype = ctypes.c_void_p


class Group:
    """Children started together. Each in a session of its own (`own_sessions`) is signalled
    as a whole, with whatever it started; otherwise only the child itself is."""

    def __init__(
        self, *, own_sessions: bool, relay_stderr: bool = False, aside: Path | None = None
    ) -> None:
        self._own_sessions = own_sessions
        self._relay_stderr, self._aside = relay_stderr, aside
        self.started: list[Child] = []
        self._relays: dict[int, Relay] = {}
        self._how: dict[int, tuple[Sequence[str], Mapping[str, str], str | None, bool]] = {}

    def start(
        self,
        command: Sequence[str],
        environ: Mapping[str, str],
        *,
        program: str | None = None,
        capture: bool = False,
    ) -> Child:
        """Starts `command` (`program`: its first word, found); raises OSError if it cannot."""
        relayed = self._relay_stderr and not capture
        child = subprocess.Popen(
            list(command),
            executable=program,
            env=dict(environ),
            stdin=subprocess.DEVNULL if capture else None,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.STDOUT if capture else subprocess.PIPE if relayed else None,
            text=True,
            start_new_session=self._own_sessions,
            # The calls it makes are looked up already, so a fork beside threads is safe.
            preexec_fn=_in_the_child,  # noqa: PLW1509
        )
        if relayed:
            assert child.stderr is not None
            self._relays[child.pid] = Relay(child.stderr.fileno(), sys.stderr.fileno(), self._aside)
        self.started.append(child)
        self._how[child.pid] = (command, environ, program, capture)
        return child

    def relay(self, child: Child) -> Relay | None:
        """The relay of a child's stderr, if relayed."""
        return self._relays.get(child.pid)

    def start_again(self, child: Child) -> Child:
        """Starts `child`'s command again, as it was started."""
        command, environ, program, capture = self._how[child.pid]
        return self.start(command, environ, program=program, capture=capture)

    def signal(self, signum: int, children: Sequence[Child] | None = None) -> None:
        """Sends `signum` to each of `children` (by default all) still running: an exited one's
        pid may be another process's by now."""
        for child in self.started if children is None else children:
            if child.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                if self._own_sessions:
                    os.killpg(child.pid, signum)
                else:
                    child.send_signal(signum)

    def stop(self, grace: float, children: Sequence[Child] | None = None) -> None:
        """SIGTERM to each of `children` (by default all), SIGKILL after `grace` seconds."""
        running = [
            child for child in (self.started if children is None else children)
            if child.poll() is None
        ]  # fmt: skip
        self.signal(signal.SIGTERM, running)
        deadline = time.monotonic() + grace
        for child in running:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL, [child])
                child.wait()


@contextlib.contextmanager
def handling(signums: Sequence[signal.Signals], handler: Handler) -> Iterator[None]:
    """Within the block, `handler` takes these signals; then their handlers are restored."""
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)


def _in_the_child() -> None:
    """Run in the child before its command: it dies with this process, and the signals passed
    on act on it, where a script's background job or nohup would have it inherit them ignored."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    for signum in (*STOPPING, *PASSED_ON):
        _SIGNAL(signum, None)

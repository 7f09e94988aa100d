"""The commands a supervisor runs, as one group: each dies with the supervisor (none outlives
one killed outright), signalled together, stopped with a grace period. A command's stderr is
passed on as it comes and read on the way (Relay): why it failed, and whether its traceback ran
through Keras 3; a native library's fatal end can go to a file."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Callable

from tfconfig_slurm.process import timing
from tfconfig_slurm.process.user_code import versions

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
    as a whole, with whatever it started; otherwise only the child itself is, and its stderr,
    unless captured, is relayed."""

    def __init__(self, *, own_sessions: bool, aside: Path | None = None) -> None:
        self._own_sessions, self._aside = own_sessions, aside
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
        relayed = not self._own_sessions and not capture
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

    def stop(self, grace: float) -> None:
        """SIGTERM to each child, SIGKILL after `grace` seconds."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.started:
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


# A frame in folders only Keras 3's keras/src has (not Keras 2's, nor tf_keras/src).
_KERAS_3_FRAME = re.compile(r'File ".*[/\\]keras[/\\]src[/\\](trainers|ops|backend)[/\\]')
# Any frame of the keras package: Keras 3 filters its own frames out of a traceback, leaving
# only traceback_utils.py, which Keras 2 has too; it is Keras 3's where that is installed.
_KERAS_FRAME = re.compile(r'File ".*[/\\]keras[/\\]src[/\\]')
_TRACEBACK = "Traceback (most recent call last):"
# What one read takes at most: output passes on as it comes, a progress bar's \r included.
_CHUNK = 1 << 16
_WHY_CHARS = 300
# A line of TensorFlow's C++ log (or absl's): not a message's next line.
_LOG_LINE = re.compile(r"[IWEF]\d{4} ")
# absl's FATAL line (JAX's, when a peer died), then a native stack trace silent on the peer.
_FATAL = re.compile(rb"F\d{4} [^\]]*\] ")


class Relay:
    """Copies a command's stderr to this process's from a thread, reading it on the way. File
    descriptors, not buffered files: a daemon thread blocked in a buffered read holds its lock,
    and an interpreter shutting down beside it aborts (`_enter_buffered_busy`)."""

    def __init__(self, source: int, sink: int, aside: Path | None = None) -> None:
        self._source, self._sink, self._aside = source, sink, aside
        self._aborting = False
        self._partial = b""
        # How much of `_partial` is passed on already: a line without its newline yet (a
        # progress bar's) is not held back, but one that may be a FATAL line is.
        self._shown = 0
        self._in_traceback = False
        self._last_line = ""
        self._exception = ""
        self._message_goes_on = False
        # Whether the command's last traceback ran through Keras 3 (`import keras`).
        self.through_keras_3 = False
        self._thread = threading.Thread(target=self._copy, name="stderr", daemon=True)
        self._thread.start()

    def finish(self, seconds: float = timing.OUTPUT_FINISH_SECONDS) -> None:
        """Waits at most `seconds` (a child of it may hold stderr open) for the output's end."""
        self._thread.join(timeout=seconds)

    def why_it_failed(self) -> str:
        """The exception line of the command's last traceback, else its last line."""
        return self._exception or self._last_line

    def _copy(self) -> None:
        while chunk := _next_chunk(self._source):
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                self._pass_on(line + b"\n")
                self._shown = 0
                self._read(line.decode(errors="replace").rstrip("\r"))
            if self._aside is None or not self._partial.startswith(b"F"):
                self._pass_on(self._partial)
                self._shown = len(self._partial)
        if self._partial:
            self._pass_on(self._partial)
            self._read(self._partial.decode(errors="replace"))

    def _pass_on(self, data: bytes) -> None:
        """Writes what of `data`, the current line, is not passed on yet: to the sink, or from
        a FATAL line on aside, that line's first sentence to the sink."""
        if self._aside is not None and not self._aborting and _FATAL.match(data):
            self._aborting = True
            head, _, message = data.partition(b"] ")
            first = message.split(b". ")[0].rstrip(b"\n .")
            self._last_line = first.decode(errors="replace")
            _write(self._sink, b"%s] %s (the rest, and its native stack trace: %s)\n" % (
                head, first, os.fsencode(self._aside)
            ))  # fmt: skip
        if self._aborting:
            assert self._aside is not None
            try:
                self._aside.parent.mkdir(parents=True, exist_ok=True)
                # Appended: a command started again (a worker's restart) keeps the first's.
                with self._aside.open("ab") as aside:
                    aside.write(data[self._shown :])
                return
            except OSError:
                pass  # a file that cannot be written: the lines go on to the sink instead
        _write(self._sink, data[self._shown :])

    def _read(self, line: str) -> None:
        if line.startswith(_TRACEBACK):
            self._in_traceback, self._exception, self.through_keras_3 = True, "", False
        elif self._in_traceback and line and not line[0].isspace():
            # The exception, whose message may run on over lines (a PerReplica's repr), read up
            # to _WHY_CHARS.
            self._in_traceback, self._exception, self._message_goes_on = False, line, True
        elif self._in_traceback and (
            _KERAS_3_FRAME.search(line) or (_KERAS_FRAME.search(line) and _keras_is_3())
        ):
            self.through_keras_3 = True
        elif self._message_goes_on and line.strip() and not _LOG_LINE.match(line):
            self._exception = f"{self._exception} {line.strip()}"
            self._message_goes_on = len(self._exception) < _WHY_CHARS
        else:
            self._message_goes_on = False
        if line.strip() and not self._aborting:
            self._last_line = line.strip()


def _write(sink: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sink, view) :]


def _next_chunk(source: int) -> bytes:
    """What the command wrote next; b"" once the pipe is closed."""
    try:
        return os.read(source, _CHUNK)
    except OSError:
        return b""


@functools.cache
def _keras_is_3() -> bool:
    """Whether the keras this Python has installed is Keras 3 (or later)."""
    keras = versions.installed().keras
    return keras is not None and keras.split(".")[0].isdigit() and int(keras.split(".")[0]) >= 3

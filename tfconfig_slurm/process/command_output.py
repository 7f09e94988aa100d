"""A supervised command's stderr, passed on as it comes and read on the way: the line that says
why it failed (the exception line of its last Python traceback, else its last line), and
whether that traceback ran through Keras 3, which the tf-keras layouts cannot train. No
TensorFlow here.
"""

from __future__ import annotations

import re
import threading
from typing import IO

# A frame of a traceback through Keras 3's package (tf-keras's is tf_keras/src).
_KERAS_3_FRAME = re.compile(r'File ".*[/\\]keras[/\\]src[/\\]')
_TRACEBACK = "Traceback (most recent call last):"
# What one read takes at most: output passes on as it comes, a progress bar's \r included.
_CHUNK = 1 << 16


class Relay:
    """Copies a command's stderr to this process's, from a thread, reading it on the way."""

    def __init__(self, source: IO[bytes], sink: IO[bytes]) -> None:
        self._source, self._sink = source, sink
        self._partial = b""
        self._in_traceback = False
        self._last_line = ""
        self._exception = ""
        self._keras_3 = False
        self._thread = threading.Thread(target=self._copy, name="stderr", daemon=True)
        self._thread.start()

    def why_it_failed(self) -> str:
        """The exception line of the command's last traceback, else its last line; "" where
        it said nothing. Read once its output has ended."""
        self._thread.join(timeout=5.0)
        return self._exception or self._last_line

    @property
    def through_keras_3(self) -> bool:
        """Whether the command's last traceback ran through Keras 3 (`import keras`)."""
        self._thread.join(timeout=5.0)
        return self._keras_3

    def _copy(self) -> None:
        read = getattr(self._source, "read1", self._source.read)
        while chunk := read(_CHUNK):
            self._sink.write(chunk)
            self._sink.flush()
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                self._read(line.decode(errors="replace").rstrip("\r"))
        if self._partial:
            self._read(self._partial.decode(errors="replace"))

    def _read(self, line: str) -> None:
        if line.startswith(_TRACEBACK):
            self._in_traceback, self._exception, self._keras_3 = True, "", False
        elif self._in_traceback and line and not line[0].isspace():
            # The first unindented line after the frames: the exception, whose message may
            # run on over many lines (a PerReplica's repr), which are not its first.
            self._in_traceback, self._exception = False, line
        elif self._in_traceback and _KERAS_3_FRAME.search(line):
            self._keras_3 = True
        if line.strip():
            self._last_line = line.strip()

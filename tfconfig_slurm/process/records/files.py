"""Files a run keeps written whole and durably, even by a node that crashes: written aside and
flushed, then renamed into place (or, where the first writer's is to stay, linked), the folder
flushed. A file's mode is as a plain open() gives it: nothing here changes the umask, which
every thread shares. No TensorFlow."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Writes `text` into `path` so that no reader, and no crash, sees half of it."""
    partial = _aside(path, text)
    try:
        replace_durably(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def create_whole(path: Path, text: str) -> bool:
    """Writes `text` into `path` unless it exists (then False): written aside and linked into
    place, so that a reader sees all of it or nothing and the first writer's stays."""
    partial = _aside(path, text)
    try:
        os.link(partial, path)
    except FileExistsError:
        return False
    except OSError:
        # A file system without hard links: created exclusively, then written (a reader in
        # between finds it empty).
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as created:
            created.write(text)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    _fsync(path.parent)
    return True


def _aside(path: Path, text: str) -> Path:
    """`text` written and flushed to the disk beside `path`, under a name of its own."""
    # Hidden, which the runs table does not list, and this thread's alone; one a crashed
    # process left (its pid and thread id can come again, in a container) is written over.
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    return partial


def replace_durably(written: Path, path: Path) -> None:
    """Flushes the file `written` to the disk and renames it to `path`, the rename flushed
    too (a rename alone may reach the disk before the file's data)."""
    _fsync(written)
    os.replace(written, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    # Linux flushes a file, or a folder's entries, through a descriptor opened to read.
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

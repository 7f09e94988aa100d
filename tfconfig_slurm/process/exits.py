"""How processes end: a child's, as its return code says; and this one's, at once, its logs
out, with the reason (the one place the package calls os._exit), as a task may be hung inside
TensorFlow or JAX (a peer lost mid-collective) where only an exit reaches it, a parameter
server's gRPC server cannot be stopped, and an interpreter that imported TensorFlow is slow to
shut down. Whoever ends the process flushes its own writers (event files, checkpoints) first."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from absl import logging


def end_now(status: int, reason: str) -> NoReturn:
    """Ends this process with `status`; `reason` is logged at --v=1."""
    logging.vlog(1, "exit %d: %s", status, reason)
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code: 128 + N for a child signal N ended."""
    return 128 - returncode if returncode < 0 else returncode


def how_it_ended(returncode: int) -> str:
    """`failed with exit status 1`, `was killed by SIGKILL`."""
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"failed with exit status {returncode}"

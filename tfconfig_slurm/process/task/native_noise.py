"""TensorFlow's start-up notes, which its C++ writes to file descriptor 2 before any logging
setting reaches them (TF_CPP_MIN_LOG_LEVEL does not, in TensorFlow 2.16+): held while it loads
and first looks at its devices, then passed on without them. No TensorFlow here."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

from absl import logging

# Notes, not problems: the lines TensorFlow writes as it loads on any machine.
_NOTES = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[IW]\d{4} .* (port|cpu_feature_guard)\.cc:\d+\] "
    rb"|To enable the following instructions: )"
)
# TensorFlow's words for a machine without a GPU driver: news only where GPUs were asked for.
_NO_DRIVER = re.compile(
    rb"^([IW]\d{4} .* cudart_stub\.cc:\d+\] Could not find cuda drivers"
    rb"|E\d{4} .* cuda_platform\.cc:\d+\] failed call to cuInit)"
)


@contextlib.contextmanager
def start_up_notes_held(gpus_asked: bool) -> Iterator[None]:
    """File descriptor 2 held within the block, then written less TensorFlow's start-up notes,
    and, where no GPU was asked for, less its lines about a missing GPU driver, said once in
    words instead where the block ended well (bad input refused there stays one line)."""
    sys.stderr.flush()
    saved = os.dup(2)
    ended_well = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
            ended_well = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().splitlines(keepends=True)
            kept = [line for line in lines if not _NOTES.match(line)]
            no_driver = [line for line in kept if _NO_DRIVER.match(line)]
            if not gpus_asked:
                kept = [line for line in kept if not _NO_DRIVER.match(line)]
            with os.fdopen(os.dup(2), "wb") as stderr:
                stderr.writelines(kept)
            if no_driver and not gpus_asked and ended_well:
                logging.info("no GPU driver on this machine: TensorFlow trains on its CPUs")

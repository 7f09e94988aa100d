"""How a process of ours speaks to its user, whichever door it came in by: one line and exit
status 2 for what the user can fix, absl logging on stderr."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from tfconfig_slurm.errors import ExitStatus


def fail(program: str, message: str) -> NoReturn:
    """Ends the process with one line on stderr, nothing on stdout, and exit status 2."""
    sys.stderr.write(f"{program}: {' '.join(message.split())}\n")
    sys.exit(ExitStatus.REFUSED)


def a_or_an(noun: str) -> str:
    """`noun` with its article, for a type's name in a message: "an int", "a dict"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def script_name() -> str:
    """The name a user's script runs under, for its one-line errors."""
    # os.path, not pathlib, whose import (urllib, ipaddress) slows every task's start.
    name = os.path.basename(sys.argv[0])
    # python -c gives "-c" for the script.
    return name if name not in ("", "-c") else "python"


def start_logging() -> None:
    """As absl.app does: absl's handler on stderr, INFO unless --verbosity says otherwise."""
    # Imported only here, so that a command that does not log does not pay for them.
    from absl import flags, logging  # noqa: PLC0415

    logging.use_absl_handler()
    verbosity = flags.FLAGS["verbosity"]
    if verbosity.using_default_value:
        verbosity.value = 0

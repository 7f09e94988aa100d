"""The `tfconfig-slurm` command: the layout tool (tfconfig.py), or with `runs` first the table
of an output root's runs (runs.py), or with `srun` a batch script's job step, started again
where a task was lost (srun.py). Each defines its own flags, so only one is imported."""

from __future__ import annotations

import difflib
import importlib
import sys

from tfconfig_slurm.commands import task_config
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.console import fail

_PROGRAM = task_config.PROGRAM
_COMMANDS = ("runs", "srun")


def tfconfig_slurm() -> None:
    if len(sys.argv) == 1:
        task_config.run_without_flags()
    word = sys.argv[1]
    if word in _COMMANDS:
        del sys.argv[1]
        importlib.import_module(f"tfconfig_slurm.commands.{word}").run()
    if not word.startswith("-"):
        # The layout tool takes flags only: a word first is a command, mistyped or unknown.
        close = sorted(difflib.get_close_matches(word, _COMMANDS))
        guess = f"; did you mean {' or '.join(close)}?" if close else ""
        fail(
            _PROGRAM,
            UsageError(
                repr(word),
                f"is not a command of {_PROGRAM}{guess}",
                f"{_PROGRAM} runs [OUTPUT_ROOT] lists the runs; {_PROGRAM} --explain "
                "--nodelist='gpu[01-04]' plans a layout; --help says more",
            ).one_line(),
        )
    from tfconfig_slurm.commands import tfconfig  # noqa: PLC0415

    tfconfig.run()


if __name__ == "__main__":
    tfconfig_slurm()

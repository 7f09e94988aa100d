"""The `tfconfig-slurm` command: the layout tool (tfconfig.py), or with `runs` first the table
of an output root's runs (runs.py). Each defines its own flags, so only one is imported."""

from __future__ import annotations

import sys


def tfconfig_slurm() -> None:
    if sys.argv[1:2] == ["runs"]:
        del sys.argv[1]
        from tfconfig_slurm.commands import runs  # noqa: PLC0415

        runs.run()
    from tfconfig_slurm.commands import tfconfig  # noqa: PLC0415

    tfconfig.run()


if __name__ == "__main__":
    tfconfig_slurm()

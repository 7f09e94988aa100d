"""`python -m tfconfig_slurm.run` (and `tfconfig-slurm-run`): tfconfig_slurm.commands.run, its
stop signals held from the first line (process/held_signals.py)."""

from tfconfig_slurm.process import held_signals


def main() -> None:
    # Before the imports, which take seconds on a busy node: a stop signal meanwhile is kept.
    held_signals.hold()
    from tfconfig_slurm.commands.run import run  # noqa: PLC0415

    run()


if __name__ == "__main__":
    main()

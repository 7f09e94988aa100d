"""`python -m tfconfig_slurm.tfconfig`, the documented name of tfconfig_slurm.commands.tfconfig;
with no argument, the same TF_CONFIG without importing the flags (commands/main.py)."""

import sys

if __name__ == "__main__":
    if len(sys.argv) == 1:
        from tfconfig_slurm.commands.main import run_without_flags

        run_without_flags()
    from tfconfig_slurm.commands.tfconfig import run

    run()

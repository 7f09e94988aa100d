"""`python -m tfconfig_slurm.run`, the documented name of tfconfig_slurm.commands.run."""

from tfconfig_slurm.commands.run import run

if __name__ == "__main__":
    run()

"""`python -m tfconfig_slurm.tfconfig`, the documented name of tfconfig_slurm.commands.tfconfig."""

from tfconfig_slurm.commands.tfconfig import run

if __name__ == "__main__":
    run()

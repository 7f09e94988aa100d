"""`python -m tfconfig_slurm`: the `tfconfig-slurm` command (commands/main.py), for an
environment whose scripts are not on PATH."""

from tfconfig_slurm.commands.main import tfconfig_slurm

if __name__ == "__main__":
    tfconfig_slurm()

"""`python -m tfconfig_slurm.commands`: the `tfconfig-slurm` command (main.py)."""

from tfconfig_slurm.commands.main import tfconfig_slurm

tfconfig_slurm()

"""Fixtures shared by test modules: the real SLURM test cluster."""

pytest_plugins = ["tests.slurm_cluster"]

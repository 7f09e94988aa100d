"""The pure core: SLURM environment -> step -> layout -> TF_CONFIG. Never imports TensorFlow."""

from tfconfig_slurm.cluster.layout import ClusterLayout, LayoutPolicy, Task, lay_out, lay_out_step
from tfconfig_slurm.cluster.step import SlurmStep, StepShape, in_job_step, read_slurm_step

__all__ = [
    "ClusterLayout",
    "LayoutPolicy",
    "SlurmStep",
    "StepShape",
    "Task",
    "in_job_step",
    "lay_out",
    "lay_out_step",
    "read_slurm_step",
]

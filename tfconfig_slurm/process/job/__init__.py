"""The SLURM job around a run: its time limit, a stop signal and the requeue, a run that goes on in
a new job, and whether a failed step starts again. No TensorFlow here."""

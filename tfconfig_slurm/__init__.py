"""tfconfig-slurm: TensorFlow and Keras training on SLURM (Estimator on TensorFlow 2.15, tf-keras
on 2.16+, Keras 3 on JAX).

`tfconfig_slurm.cluster` turns a SLURM task's environment into its TF_CONFIG without TensorFlow
(`python -m tfconfig_slurm.tfconfig` prints or explains it); `input_shard()` says which share of
the data a trainer reads. Imported on first use, and left out of `import *`: train_and_evaluate
(Estimator's), cluster_resolver(...) (a tf.distribute resolver, which raises TfconfigSlurmError
on a bad setting, for the script to catch) and keras_distribution() (Keras 3's, which ends the
process in one line, exit 2, on a bad setting or a missing install).
"""

import functools
from typing import Any, Callable

from tfconfig_slurm.cluster import ClusterLayout, LayoutPolicy, SlurmStep, StepShape, Task
from tfconfig_slurm.cluster.role import Shard, input_shard
from tfconfig_slurm.errors import LayoutError, SlurmEnvironmentError, TfconfigSlurmError, UsageError

__version__ = "0.1.0"

__all__ = [
    "ClusterLayout",
    "LayoutError",
    "LayoutPolicy",
    "Shard",
    "SlurmEnvironmentError",
    "SlurmStep",
    "StepShape",
    "Task",
    "TfconfigSlurmError",
    "UsageError",
    "input_shard",
]


def __getattr__(name: str) -> Any:
    # The layout tools never import TensorFlow; the runtime only when it is asked for.
    if name == "keras_distribution":
        from tfconfig_slurm.backends.keras3.boot import keras_distribution  # noqa: PLC0415

        return _in_one_line(keras_distribution)
    if name not in ("train_and_evaluate", "cluster_resolver"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from tfconfig_slurm.process.user_code import versions  # noqa: PLC0415

    if name == "train_and_evaluate":
        _in_one_line(versions.require_estimator)("tfconfig_slurm.train_and_evaluate (Estimator)")
        from tfconfig_slurm.backends.estimator.api import train_and_evaluate  # noqa: PLC0415

        return train_and_evaluate
    _in_one_line(versions.require_tensorflow)("tfconfig_slurm.cluster_resolver")
    from tfconfig_slurm.backends.keras.resolver import cluster_resolver  # noqa: PLC0415

    # Its bad settings raise, as layout.md shows them caught.
    return cluster_resolver


def _in_one_line(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, ending the process in one line and exit status 2 on one of this package's
    errors, as the commands do: under srun, a traceback in every task hid what to fix."""

    @functools.wraps(function)
    def ended_in_one_line(*arguments: Any, **keywords: Any) -> Any:
        from tfconfig_slurm.process import console  # noqa: PLC0415

        try:
            return function(*arguments, **keywords)
        except TfconfigSlurmError as error:
            console.fail(console.script_name(), error.one_line())

    return ended_in_one_line

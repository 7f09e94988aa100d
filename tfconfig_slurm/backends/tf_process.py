"""This TensorFlow process as the runtime sets it up: TensorFlow's and Estimator's own INFO
lines silenced, and thread pools held."""

from __future__ import annotations

import logging
from pathlib import Path

import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.python.util import deprecation

# Estimator's own INFO lines (every graph build, every checkpoint) drown the runtime's; its
# warnings still show. --verbosity=1 does not bring them back: they are TensorFlow's logger.
tf.get_logger().setLevel("WARNING")
# TensorFlow 2.16+ and Keras log some INFO lines (a SavedModel export's) through absl's logger,
# the runtime's own: those are dropped by the file they come from; their warnings still show.
_LIBRARIES = tuple(
    str(Path(tf.__file__).parents[1] / name) for name in ("tensorflow", "tf_keras", "keras")
)

absl_logging.get_absl_logger().addFilter(
    lambda record: record.levelno >= logging.WARNING or not record.pathname.startswith(_LIBRARIES)
)
# A trainer beside others on parameter servers may read the same global step before two of its
# own steps; Estimator's step counter then warns that the optimizer counts no steps.
tf.get_logger().addFilter(
    lambda record: not record.getMessage().startswith("It seems that global step")
)
# Estimator is deprecated as a whole, and TensorFlow 2.15 says so at every call of its API:
# users of this runtime chose it knowingly. The switch is private, but TensorFlow is pinned.
deprecation._PRINT_DEPRECATION_WARNINGS = False


def hold_threads(intra_op: int, inter_op: int) -> None:
    """Holds this process's thread pools to these sizes (0: TensorFlow picks); call it before
    TensorFlow runs anything: TensorFlow 2 makes them once, from its eager context, and a
    Session's ConfigProto does not resize them (bench/RESULTS.md)."""
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def look_at_devices() -> None:
    """Has TensorFlow find this process's devices now, while its start-up notes are held back
    (process/task/native_noise.py), without starting its runtime: a strategy made later (which
    MultiWorkerMirroredStrategy must be) still sets that up."""
    tf.config.list_physical_devices()

"""Which TensorFlow, Keras and JAX this Python has, read from the packages' metadata without
importing them (an import takes seconds), and the check that a runtime can run on them. No
TensorFlow here."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from typing import NamedTuple

from tfconfig_slurm.errors import InstallError

# TensorFlow ships under several distribution names; the module is `tensorflow` in each.
_TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-intel",
    "tensorflow-macos",
    "tensorflow-aarch64",
    "tf-nightly",
    "tf-nightly-cpu",
)
LAST_ESTIMATOR_RELEASE = (2, 15)
_ESTIMATOR_INSTALL = (
    "install the Estimator extra into a Python 3.9-3.11 environment, in the tfconfig-slurm "
    "checkout: make venv (.venv), or python3.11 -m venv venv && venv/bin/pip install "
    "'.[estimator]'; on TensorFlow 2.16+, train a Keras experiment (--experiment mnist_keras), "
    "or run a MultiWorkerMirroredStrategy script under with-tfconfig --all_reduce"
)
_KERAS_INSTALL = (
    "install the tf2 extra, in the tfconfig-slurm checkout: make venv-tf2 (.venv-tf2), or "
    "pip install '.[tf2]' (TensorFlow 2.16+ with tf-keras, Python 3.9-3.13 by release)"
)
# The oldest JAX the Keras 3 runtime runs on (CI tests it): the rest it needs came earlier.
OLDEST_JAX = (0, 8, 2)
_OLDEST_JAX_LACKS = (
    "the option that turns its preemption service off (jax_enable_preemption_service), which "
    "would take the SIGTERM the runtime stops on"
)
_KERAS3_INSTALL = (
    "install the keras3 extra (keras3-cuda12 or keras3-cuda13 for GPUs), in the tfconfig-slurm "
    "checkout: make venv-keras3 (.venv-keras3), or pip install '.[keras3]' (Keras 3 and JAX; "
    "JAX's current releases need Python 3.12+)"
)


class Installed(NamedTuple):
    """The versions installed, None for a package that is not."""

    python: tuple[int, int]
    tensorflow: str | None
    estimator: str | None
    tf_keras: str | None = None
    keras: str | None = None
    jax: str | None = None

    @property
    def this_python(self) -> str:
        """`this Python 3.11`, as the errors say it."""
        return "this Python {}.{}".format(*self.python)


def installed() -> Installed:
    return Installed(
        python=(sys.version_info[0], sys.version_info[1]),
        tensorflow=next(filter(None, map(_version, _TENSORFLOW_DISTRIBUTIONS)), None),
        estimator=_version("tensorflow-estimator"),
        tf_keras=_version("tf-keras"),
        keras=_version("keras"),
        jax=_version("jax"),
    )


def require_estimator(what: str, found: Installed | None = None) -> None:
    """InstallError for `what` unless TensorFlow 2.15 or older and tensorflow-estimator are."""
    found = found or installed()
    problem = (
        f"needs TensorFlow 2.15, which {found.this_python} does not have"
        if found.tensorflow is None
        else f"needs TensorFlow 2.15, the last release with Estimator, and {found.this_python} "
        f"has TensorFlow {found.tensorflow}"
        if not has_estimator_release(found.tensorflow)
        else f"needs tensorflow-estimator beside TensorFlow {found.tensorflow}"
        if found.estimator is None
        else None
    )
    if problem is not None:
        raise InstallError(what, problem, _ESTIMATOR_INSTALL)


def require_tensorflow(what: str, found: Installed | None = None) -> None:
    """Raises InstallError, naming `what` needed it, unless some TensorFlow is installed."""
    found = found or installed()
    if found.tensorflow is None:
        raise InstallError(
            what, f"needs TensorFlow, which {found.this_python} does not have", _KERAS_INSTALL
        )


def require_keras(what: str, found: Installed | None = None, *, twin: str | None = None) -> None:
    """InstallError for `what` unless TensorFlow 2.16+ and tf-keras (Keras 2, whose
    multi-worker training works) are; names a Keras 3 `twin` where Keras 3 is."""
    found = found or installed()
    hint = _KERAS_INSTALL
    if found.tensorflow is None or has_estimator_release(found.tensorflow):
        has = f"TensorFlow {found.tensorflow}" if found.tensorflow else "no TensorFlow"
        problem = f"needs TensorFlow 2.16 or later with tf-keras, and {found.this_python} has {has}"
        if found.tensorflow is None and found.jax and _release(found.keras or "0.0")[:2] >= (3, 0):
            # Most likely a Keras 3 experiment that imports tf_keras by mistake.
            problem += (
                f", but Keras {found.keras} on JAX, which trains an experiment that imports "
                "keras, not tf_keras"
            )
            fix = "import keras, not tf_keras, to train it on JAX here"
            if twin is not None:
                fix = f"--experiment={twin} trains the same model on JAX here"
            hint = f"{fix}; or {hint}"
    elif found.tf_keras is None:
        problem = f"needs tf-keras beside TensorFlow {found.tensorflow}"
    else:
        return
    raise InstallError(what, problem, hint)


def require_keras3(what: str, found: Installed | None = None) -> None:
    """InstallError for `what` unless Keras 3 and JAX (its multi-process backend) are."""
    found = found or installed()
    if found.keras is None or _release(found.keras)[:2] < (3, 0):
        has = f"Keras {found.keras}" if found.keras else "no Keras"
        problem = f"needs Keras 3 with JAX, and {found.this_python} has {has}"
    elif found.jax is None:
        problem = f"needs JAX beside Keras {found.keras} (the backend it trains on here)"
    elif _release(found.jax) < OLDEST_JAX:
        problem = (
            f"needs JAX {'.'.join(map(str, OLDEST_JAX))} or later, and {found.this_python} has JAX "
            f"{found.jax}, which lacks {_OLDEST_JAX_LACKS}"
        )
    else:
        return
    raise InstallError(what, problem, _KERAS3_INSTALL)


def has_estimator_release(tensorflow: str) -> bool:
    """Whether TensorFlow `tensorflow` (a version) still has Estimator (2.15 and older)."""
    return _release(tensorflow)[:2] <= LAST_ESTIMATOR_RELEASE


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int, int]:
    """(major, minor, micro) of `version`, of a micro its leading digits only (`0rc1`: 0)."""
    parts = version.split(".")
    try:
        micro = re.match(r"\d*", parts[2] if len(parts) > 2 else "")[0]  # type: ignore[index]
        return int(parts[0]), int(parts[1]), int(micro or 0)
    except (IndexError, ValueError):
        # A version we cannot read is taken for a recent one: the error says which it is.
        return (sys.maxsize, 0, 0)

"""versions.py: the Estimator runtime's check of what is installed, read without TensorFlow."""

from __future__ import annotations

import pytest

from tfconfig_slurm.errors import InstallError
from tfconfig_slurm.runtime import versions
from tfconfig_slurm.runtime.versions import Installed


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        (Installed((3, 12), None, None), "needs TensorFlow 2.15, which this Python 3.12 does not"),
        (
            Installed((3, 12), "2.21.0", None),
            "needs TensorFlow 2.15, the last release with Estimator, and this Python 3.12 has "
            "TensorFlow 2.21.0",
        ),
        (Installed((3, 11), "2.16.0rc0", "2.15.0"), "has TensorFlow 2.16.0rc0"),
        (Installed((3, 11), "2.15.1", None), "needs tensorflow-estimator beside TensorFlow 2.15.1"),
    ],
)
def test_what_cannot_run_the_estimator_runtime_is_named(found: Installed, problem: str) -> None:
    with pytest.raises(InstallError) as raised:
        versions.require_estimator("--experiment=mnist_deep (Estimator)", found)
    assert raised.value.culprit == "--experiment=mnist_deep (Estimator)"
    assert problem in raised.value.problem
    assert "tfconfig-slurm[estimator]" in raised.value.hint


@pytest.mark.parametrize("tensorflow", ["2.15.0", "2.15.1", "2.14.0"])
def test_tensorflow_2_15_and_older_with_the_estimator_can(tensorflow: str) -> None:
    versions.require_estimator("x", Installed((3, 11), tensorflow, "2.15.0"))


def test_this_estimator_environment_is_read_as_one() -> None:
    found = versions.installed()
    assert found.tensorflow is not None and found.tensorflow.startswith("2.15.")
    assert found.estimator is not None
    versions.require_estimator("x")

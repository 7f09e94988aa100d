"""Fixtures shared by test modules: the real SLURM test cluster; three lanes, run side by side
by tests/lanes (`--lane` picks one): the tests on each of the cluster's two partitions in a
lane of its own (slurm: the Estimator suite's, on node1-3; slurm2: the TensorFlow 2.16+ and
Keras 3 suites', and the Estimator ones marked second_partition, on node4-5), one test at a
time (they check what jobs leave on their nodes), and the others in the host lane, its
TensorFlow-free tests eight at a time in tests/lanes (each that runs a command on ports takes
a free block of its own), its TensorFlow ones one at a time; and the TensorFlow 2.16+ tests
(marked tf2) skipped, with the reason, where tf-keras is not installed, and the Keras 3 ones
(marked keras3) where .venv-keras3 is not made."""

from __future__ import annotations

import importlib.util

import pytest

# Its asserts rewritten as a plugin's are, though this module imports it first.
pytest.register_assert_rewrite("tests.slurm_cluster")

from tests.cli import KERAS3_PYTHON  # noqa: E402
from tests.slurm_cluster import second_partition  # noqa: E402

pytest_plugins = ["tests.slurm_cluster"]


LANES = ("host", "slurm", "slurm2")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane", choices=LANES, help="only the tests of this lane (tests/lanes runs each)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = config.getoption("lane")
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        (kept if chosen in (None, _lane(item)) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    if not KERAS3_PYTHON.exists():
        skip = pytest.mark.skip(reason="needs .venv-keras3 (Keras 3 on JAX): make venv-keras3")
        for item in items:
            if "keras3" in item.keywords:
                item.add_marker(skip)
    if importlib.util.find_spec("tf_keras") is not None:
        return
    skip = pytest.mark.skip(
        reason="needs TensorFlow 2.16+ with tf-keras: make test runs it in .venv-tf2"
    )
    for item in items:
        if "tf2" in item.keywords:
            item.add_marker(skip)


def _lane(item: pytest.Item) -> str:
    """A test's lane: a test on the cluster runs on its partition's (slurm_cluster's choice)."""
    if "slurm_cluster" not in getattr(item, "fixturenames", ()):
        return "host"
    return "slurm2" if second_partition(item) else "slurm"

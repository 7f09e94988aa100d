"""Fixtures shared by test modules: the real SLURM test cluster; two lanes, the tests on the
cluster in one (one cluster; they check what jobs leave on its nodes) and the others in the
other, run side by side by tests/lanes (`--lane` picks one) or as pytest-xdist's two workers
(`-n 2 --dist loadgroup`): the cluster's one test at a time, the other's TensorFlow-free tests
eight at a time in tests/lanes (each that runs a command on ports takes a free block of its
own), its TensorFlow ones one at a time; and the TensorFlow 2.16+
tests (marked tf2) skipped, with the reason, where tf-keras is not installed, and the Keras 3
ones (marked keras3) where .venv-keras3 is not made."""

from __future__ import annotations

import importlib.util

import pytest

from tests.cli import KERAS3_PYTHON

pytest_plugins = ["tests.slurm_cluster"]


LANES = ("host", "slurm")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane", choices=LANES, help="only the tests of this lane (tests/lanes runs both)"
    )


# First: pytest-xdist reads the group marks in its own hook of this name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = config.getoption("lane")
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        lane = "slurm" if "slurm_cluster" in getattr(item, "fixturenames", ()) else "host"
        item.add_marker(pytest.mark.xdist_group(lane))
        (kept if chosen in (None, lane) else left).append(item)
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

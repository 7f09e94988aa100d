"""Fixtures shared by test modules: the real SLURM test cluster; and the TensorFlow 2.16+
tests (marked tf2) skipped, with the reason, where tf-keras is not installed."""

from __future__ import annotations

import importlib.util

import pytest

pytest_plugins = ["tests.slurm_cluster"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("tf_keras") is not None:
        return
    skip = pytest.mark.skip(
        reason="needs TensorFlow 2.16+ with tf-keras: make test runs it in .venv-tf2"
    )
    for item in items:
        if "tf2" in item.keywords:
            item.add_marker(skip)

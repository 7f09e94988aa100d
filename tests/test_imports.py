"""The modules the README lists as free of TensorFlow import none of it: a login node, the
layout tools and the runs table stay fast, and run where TensorFlow is not installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE = [
    "tfconfig_slurm.cluster",
    "tfconfig_slurm.tfconfig",
    "tfconfig_slurm.with_tfconfig",
    "tfconfig_slurm.runs",
    "tfconfig_slurm.run",
    *(
        f"tfconfig_slurm.runtime.{name}"
        for name in (
            "versions", "role", "place", "experiment", "settings", "reports", "claim",
            "model_dir", "local_cluster", "preemption", "watchdog", "watch_plan", "polling",
        )
    ),
]  # fmt: skip


@pytest.mark.parametrize("module", PURE)
def test_imports_no_tensorflow(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if 'tensorflow' in m))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

"""make's refusal of a Python it is given: one line naming the variable, exit 2, and no
environment made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPOSITORY

# The suite's own Python is of the wrong version for one of the two: the Estimator suite, which
# runs these tests, runs on 3.9-3.11.
WRONG_VERSION = ("PYTHON_TF2", "venv-tf2") if sys.version_info < (3, 12) else ("PYTHON", "venv")


@pytest.mark.parametrize(
    ("variable", "target", "given", "said"),
    [
        ("PYTHON", "venv", "/no/such/python", "is not a program"),
        ("PYTHON_TF2", "venv-tf2", "/no/such/python", "is not a program"),
        # As a pyenv shim without PYENV_VERSION: a program that does not run.
        ("PYTHON", "venv", "false", "does not run"),
        ("PYTHON_TF2", "venv-tf2", "false", "does not run"),
        (*WRONG_VERSION, sys.executable, "is Python 3."),
    ],
)
def test_a_python_make_cannot_use_is_one_line(
    tmp_path: Path, variable: str, target: str, given: str, said: str
) -> None:
    result = subprocess.run(
        ["make", "-s", "-C", str(REPOSITORY), f"{variable}={given}",
         f"VENV={tmp_path / 'venv'}", f"VENV_TF2={tmp_path / 'venv-tf2'}", target],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"make: {variable}={given} {said}"), result.stderr
    assert f"HINT: make {variable}=/path/to/python3.1" in first
    assert not any(tmp_path.iterdir())

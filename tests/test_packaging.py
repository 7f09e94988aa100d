"""The built wheel, installed into a fresh environment, trains the shipped experiment by name
from a directory that is not the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.cli import REPOSITORY

pytestmark = pytest.mark.tensorflow


def test_a_wheel_trains_mnist_deep_outside_the_checkout(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(REPOSITORY)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("tfconfig_slurm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(name for name in names if name.endswith("/METADATA")))
    assert "tfconfig_slurm/experiments/mnist_deep.py" in names
    # The digits mnist_deep falls back to ship inside the wheel, so no extra brings them.
    assert "tfconfig_slurm/experiments/digits.csv.gz" in names
    assert b"scikit-learn" not in metadata

    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # The wheel alone, its dependencies (TensorFlow...) taken from this environment without
    # the checkout that this environment's editable install points at.
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    away = tmp_path / "elsewhere"
    away.mkdir()
    trained = subprocess.run(
        [python, "-m", "tfconfig_slurm.run", "--experiment", "mnist_deep", "--train_steps=5",
         "--output_root=out"],
        cwd=away, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((away / "out" / "mnist_deep" / "summary.json").read_text())
    assert summary["global_step"] == 5
    where = subprocess.run(
        [python, "-c", "import tfconfig_slurm; print(tfconfig_slurm.__file__)"],
        cwd=away, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(site))

"""The core, the process machinery and the commands import no TensorFlow when loaded: a login
node, the layout tools and the runs table stay fast, and run where TensorFlow is not installed."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfconfig_slurm import cluster, process

# Every module of the layers below the backends, and the commands that a login node runs
# without TensorFlow (setup.cfg's import contracts hold the direction; this holds what a
# process really loads, lazy imports included).
PURE = [
    "tfconfig_slurm",
    "tfconfig_slurm.tfconfig",
    "tfconfig_slurm.run",
    *(
        f"tfconfig_slurm.commands.{name}"
        for name in ("main", "tfconfig", "with_tfconfig", "runs", "run", "sweep")
    ),
    *(
        module.name
        for package in (cluster, process)
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
    ),
]


@pytest.mark.parametrize("module", PURE)
def test_imports_no_tensorflow(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if 'tensorflow' in m))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_collecting_the_suite_imports_no_tensorflow() -> None:
    """Every pytest process collects every test module (make check's eight workers, each
    lane's sessions): a module that imported TensorFlow as it was collected cost each of them
    4-6 s."""
    code = (
        "import sys, pytest; "
        "pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests']); "
        "print(sorted(m for m in ('tensorflow', 'tf_keras', 'jax') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "tests collected" in result.stdout, result.stdout[-3000:]
    assert result.stdout.splitlines()[-1] == "[]"


def test_one_module_ends_a_process_at_once() -> None:
    """os._exit, which skips every writer's flush, is called in process/exits.py only, after
    it flushed the logs and said why."""
    package = Path(cluster.__file__).parents[1]
    calling = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"\bos\._exit\(", path.read_text())
    )
    assert calling == ["process/exits.py"]


def test_slurm_s_environment_is_read_only_at_the_doors() -> None:
    """The core reads SLURM's variables (cluster/step.py); the commands, the Python API and
    place.find (the step, for every door that finds a task's place) call it. Nothing else
    reads them again: the process machinery takes the job it is handed (TaskRun.job)."""
    package = Path(cluster.__file__).parents[1]
    reading = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if re.search(r"\bread_slurm_(job|step)\(", path.read_text())
    )
    assert reading == [
        "backends/estimator/api.py",
        "cluster/step.py",
        "commands/layout_flags.py",
        "commands/run.py",
        "commands/runs.py",
        "commands/srun.py",
        "commands/task_config.py",
        "commands/with_tfconfig.py",
        "process/task/place.py",
    ]


def test_the_process_s_environment_is_written_only_at_the_doors() -> None:
    """The commands own their process's environment; below them nothing writes os.environ (a
    child's environment is built, not this one changed) but where TensorFlow's own API reads
    it, in one place each: Estimator's RunConfig reads TF_CONFIG (estimators.py), the Python
    API hands the local cluster's layout on (api.py, a door), and the final evaluation's own
    process keeps tf-keras (evaluate.py, its main)."""
    package = Path(cluster.__file__).parents[1]
    writing = re.compile(
        r"\bos\.environ\[[^\]]+\]\s*=|\bos\.environ\.(pop|setdefault|update|clear)\("
        r"|\bos\.(putenv|unsetenv)\("
    )
    below = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if writing.search(path.read_text()) and path.parent.name != "commands"
    )
    assert below == [
        "backends/estimator/api.py",
        "backends/estimator/estimators.py",
        "backends/keras/evaluate.py",
    ]


def test_every_command_s_flags_can_be_defined_in_one_process() -> None:
    """absl refuses a flag defined twice: the suite imports every command in one process, so
    two commands that each define --model_dir fail at collection (commands/model_dir_flag.py
    defines it once for both)."""
    package = Path(cluster.__file__).parents[1]
    modules = sorted(
        f"tfconfig_slurm.commands.{path.stem}"
        for path in (package / "commands").glob("*.py")
        if not path.name.startswith("__")
    )
    result = subprocess.run(
        [sys.executable, "-c", "; ".join(f"import {module}" for module in modules)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]

"""The core, the process machinery and the commands import no TensorFlow when loaded: a login
node, the layout tools and the runs table stay fast, and run where TensorFlow is not installed."""

from __future__ import annotations

import ast
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


def test_one_module_puts_jobs_in_the_queue() -> None:
    """sbatch and scontrol requeue, which queue a job (a requeue, a continuation, a sweep),
    are run by process/slurm_commands.py only: no other module names them as a command."""
    package = Path(cluster.__file__).parents[1]
    queueing = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.List, ast.Tuple))
        and [each.value for each in node.elts[:2] if isinstance(each, ast.Constant)]
        in (["sbatch"], ["sbatch", "--parsable"], ["scontrol", "requeue"])
    )
    assert queueing == ["process/slurm_commands.py", "process/slurm_commands.py"]


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
        "commands/main.py",
        "commands/run.py",
        "commands/runs.py",
        "commands/srun.py",
        "commands/with_tfconfig.py",
        "process/task/place.py",
    ]


def test_the_process_s_environment_is_written_only_at_the_doors() -> None:
    """The commands own their process's environment; below them nothing writes it (a child's
    environment is built, not this one changed; finding a task's place changes nothing) but
    the doors, each in one place: the Python API (its local cluster's layout handed on, the
    task's variables set), the resolvers a user's script calls (the task's GPUs, Keras 3's
    backend and JAX's variables), and Estimator's RunConfig, which reads TF_CONFIG. A write is
    os.environ's, or an `environ` handed down that may be it."""
    package = Path(cluster.__file__).parents[1]
    writers = sorted(
        f"{path.relative_to(package)}:{function}"
        for path in package.rglob("*.py")
        if path.parent.name != "commands"
        for function in _functions_writing_the_environment(ast.parse(path.read_text()))
    )
    assert writers == [
        "backends/estimator/api.py:_run",
        "backends/estimator/trainer.py:tf_config_environment",
        "backends/keras3/boot/__init__.py:keras_distribution",
        "process/task/place.py:Place.set_in",
    ]


def _functions_writing_the_environment(module: ast.Module) -> set[str]:
    """The qualified names of the functions in `module` that change os.environ, or a mapping
    named `environ`: item assignment or deletion, pop, setdefault, update, clear, putenv."""

    def is_environ(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "environ") or (
            isinstance(node, ast.Attribute) and node.attr == "environ"
        )

    def writes(node: ast.AST) -> bool:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            return any(
                isinstance(target, ast.Subscript) and is_environ(target.value) for target in targets
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func
            return (
                method.attr in ("pop", "setdefault", "update", "clear") and is_environ(method.value)
            ) or method.attr in ("putenv", "unsetenv")
        return False

    found: set[str] = set()

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{scope}{child.name}.")
                continue
            if writes(child):
                found.add(scope.rstrip(".") or "<module>")
            visit(child, scope)

    visit(module, "")
    return found


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


# A function's most lines, its docstring and comments included: longer ones read as several
# phases, which a name each says better (#56).
MOST_LINES = 60


def test_no_function_of_the_package_is_longer_than_60_lines() -> None:
    package = Path(cluster.__file__).parent.parent
    long = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MOST_LINES:
                    long[(path.relative_to(package).as_posix(), node.name)] = lines
    assert long == {}, f"split these into phases of at most {MOST_LINES} lines: {long}"

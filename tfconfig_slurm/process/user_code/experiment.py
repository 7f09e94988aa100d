"""The experiment protocol (docs/training.md, docs/keras.md): finding, importing and checking
the module a user wrote, an Estimator one (model_fn and its input functions) or a Keras one
(build_model and dataset), told apart by its source before it is imported; and its hparams as
the command line sets them (`--hparams=name=value,...` over its HPARAMS), or a sweep file's
lines."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from absl import logging

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.console import a_or_an
from tfconfig_slurm.process.user_code import versions

# An experiment's check of --data_dir: raises ValueError for a directory it cannot train on.
DataCheck = Callable[[str], None]
# Its check_hparams(hparams): raises ValueError, saying why, for values it refuses.
HparamsCheck = Callable[[Mapping[str, Any]], None]

# Where `--experiment NAME` looks for NAME.py after the working directory's experiments/.
_SHIPPED = Path(__file__).resolve().parents[2] / "experiments"
_HINT = "name a file experiments/NAME.py, a file path, or an importable module path"

InputFn = Callable[[Mapping[str, Any]], Any]
# What Estimator passes, by name, to the model and input functions that name them.
_ESTIMATOR_ARGUMENTS = {"features", "labels", "mode", "params", "config"}
ESTIMATOR = "Estimator"
KERAS = "Keras"
KERAS3 = "Keras 3"


@dataclass(frozen=True)
class Experiment:
    """What the runtime needs from an experiment module."""

    name: str
    model_fn: Callable[..., Any]
    train_input_fn: InputFn
    eval_input_fn: InputFn
    hparams: Mapping[str, Any]
    check_hparams: HparamsCheck | None
    serving_input_receiver_fn: Callable[[], Any] | None
    check_data: DataCheck | None = None


def locate(spec: str) -> tuple[str, Path | None]:
    """The experiment's name and its file (None: a module to import by name); imports nothing."""
    path = Path(spec)
    if not spec:
        raise UsageError("--experiment", "is empty", _HINT)
    # A file named without a folder (README.md) is a path too, not a module to look for.
    if spec.endswith(".py") or "/" in spec or (path.suffix and path.is_file()):
        if path.is_dir():
            raise UsageError("--experiment", f"{spec!r} is a directory, not a .py file", _HINT)
        if not path.is_file():
            shipped = _SHIPPED / path.name
            hint = (
                f"{path.stem} ships with tfconfig-slurm: --experiment={path.stem}"
                if shipped.is_file() and shipped.name != "__init__.py"
                else _HINT
            )
            raise UsageError("--experiment", f"file {spec!r} does not exist", hint)
        if path.suffix != ".py":
            raise UsageError("--experiment", f"file {spec!r} is not a .py file", _HINT)
        return path.stem, path
    # The working directory as it is now, not as it was at import.
    folders = (Path.cwd() / "experiments", _SHIPPED)
    for folder in folders:
        candidate = folder / f"{spec}.py"
        if candidate.is_file():
            return spec, candidate
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    if found is None:
        searched = ", ".join(map(str, folders))
        names = sorted({path.stem for folder in folders for path in folder.glob("[!_]*.py")})
        close = difflib.get_close_matches(spec, names, n=1)
        raise UsageError(
            "--experiment",
            f"{spec!r} is neither {spec}.py in an experiments folder (looked in {searched}) nor an "
            "importable module",
            f"did you mean {close[0]}?" if close else _HINT,
        )
    return spec.rsplit(".", 1)[-1], None


@dataclass(frozen=True)
class KerasExperiment:
    """What the runtime needs from a Keras experiment module."""

    name: str
    # --experiment as given, for another process to load.
    spec: str
    build_model: Callable[[Mapping[str, Any]], Any]
    dataset: Callable[[str, Mapping[str, Any]], Any]
    hparams: Mapping[str, Any]
    check_hparams: HparamsCheck | None
    check_data: DataCheck | None = None
    # Keras 3's LayoutMap of the run's devices, in process order; None: data-parallel.
    layout_map: Callable[[list[Any], Mapping[str, Any]], Any] | None = None


def kind(spec: str) -> str:
    """ESTIMATOR, KERAS or KERAS3 (build_model and `import keras`), read from the source so
    that a wrong install is named before any import."""
    tree = _syntax(spec)
    statements = tree.body if tree else []
    if "build_model" not in _top_level_names(statements):
        return ESTIMATOR
    # The top-level packages its top-level statements import.
    imported: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            imported.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module.partition(".")[0])
    return KERAS3 if "keras" in imported and "tf_keras" not in imported else KERAS


def literal_hparams(spec: str) -> dict[str, Any] | None:
    """The experiment's HPARAMS where its source assigns them a literal dict that nothing else
    names, read without importing it (and TensorFlow); None otherwise."""
    tree = _syntax(spec)
    if tree is None or _names_hparams_elsewhere(tree):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["HPARAMS"]
            and isinstance(node.value, ast.Dict)
        ):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
            return dict(value)
    return None


def _names_hparams_elsewhere(tree: ast.Module) -> bool:
    """Whether anything but one plain assignment could bind or change HPARAMS."""
    mentions = 0
    for node in ast.walk(tree):
        mentions += isinstance(node, ast.Name) and node.id == "HPARAMS"
        if (
            (isinstance(node, ast.alias) and {node.name, node.asname} & {"HPARAMS", "*"})
            or (isinstance(node, ast.Global) and "HPARAMS" in node.names)
            or (isinstance(node, ast.Constant) and node.value == "HPARAMS")
        ):
            return True
    return mentions != 1


def _syntax(spec: str) -> ast.Module | None:
    """The experiment module's syntax tree, None where its source cannot be read; a syntax
    error is refused, not taken for an Estimator experiment."""
    _, path = locate(spec)
    if path is None:
        found = importlib.util.find_spec(spec)
        path = Path(found.origin) if found is not None and found.origin else None
    if path is None:
        return None
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as error:
        raise _import_failed(spec, path, error) from None
    except (OSError, ValueError):
        return None


def _top_level_names(statements: list[ast.stmt]) -> set[str]:
    """The names a module's statements bind, looking into if, try and with blocks."""
    names: set[str] = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, (ast.If, ast.With, ast.Try)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            names.update(*map(_top_level_names, blocks))
    return names


# The shipped tf-keras experiments' Keras 3 twins: the same model, on JAX.
_KERAS3_TWINS = {"mnist_keras": "mnist_keras3"}


def require_runtime(spec: str) -> str:
    """The experiment's kind; raises InstallError unless what is installed can train it."""
    found = kind(spec)
    if found == KERAS:
        versions.require_keras(f"--experiment={spec} (Keras)", twin=_KERAS3_TWINS.get(spec))
    elif found == KERAS3:
        versions.require_keras3(f"--experiment={spec} (Keras 3)")
    else:
        versions.require_estimator(f"--experiment={spec} (Estimator)")
    return found


def choose_jax(environ: Mapping[str, str]) -> dict[str, str]:
    """The variable that sets Keras 3 on JAX, for the command that owns the environment."""
    chosen = environ.get(KERAS_BACKEND, "jax")
    if chosen != "jax":
        logging.warning(
            "%s=%s: a Keras 3 experiment trains on JAX here, the one backend with a "
            "multi-process path (keras.distribution)",
            KERAS_BACKEND,
            chosen,
        )
    return {KERAS_BACKEND: "jax"}


KERAS_BACKEND = "KERAS_BACKEND"


def load_keras(spec: str) -> KerasExperiment:
    """Imports the Keras experiment `spec` names and checks that it defines what is needed."""
    name, module = _import(spec)
    functions = {
        function: getattr(module, function, None) for function in ("build_model", "dataset")
    }
    missing = [function for function, value in functions.items() if not callable(value)]
    if missing:
        raise UsageError(
            "--experiment",
            f"{_named(module)} ({_source(module)}) defines no {' and no '.join(missing)}",
            "a Keras experiment defines build_model(params), returning the compiled model, and "
            "dataset(mode, params), returning the batches for mode 'train' or 'eval'",
        )
    _check_call(module, "build_model", "build_model(params)", {})
    _check_call(module, "dataset", "dataset(mode, params)", "train", {})
    # Refused where the run would not call it as it means to.
    layout_map = getattr(module, "layout_map", None)
    if layout_map is not None and not callable(layout_map):
        raise UsageError(
            "--experiment",
            f"{_named(module)} ({_source(module)}) defines layout_map, but not as a function",
            "define layout_map(devices, params), returning a keras.distribution.LayoutMap",
        )
    if layout_map is not None:
        _check_call(module, "layout_map", "layout_map(devices, params)", [], {})
        if kind(spec) != KERAS3:
            raise UsageError(
                "--experiment",
                f"{_named(module)} defines layout_map, which is Keras 3's (ModelParallel on JAX): "
                "a tf-keras model trains data-parallel with tf.distribute",
                "build the model with import keras and train it in .venv-keras3, or remove "
                "layout_map",
            )
    return KerasExperiment(
        name=name,
        spec=spec,
        build_model=functions["build_model"],  # type: ignore[arg-type]
        dataset=functions["dataset"],  # type: ignore[arg-type]
        layout_map=layout_map,
        **_defined_besides(module),
    )


def keeping_learning_rate(optimizer: Any, restore: Callable[[], Any]) -> None:
    """Runs `restore()`, then gives `optimizer` back the learning rate it was compiled with:
    Keras restores the rate, so a resume with another learning_rate trained on the old one."""
    rate = optimizer.get_config().get("learning_rate")
    restore()
    if isinstance(rate, numbers.Real):
        optimizer.learning_rate = float(rate)


def type_named(value: Any) -> str:
    """`value`'s type by its module-qualified name (`keras.src.models.model.Model`), a
    built-in one's plainly (`dict`)."""
    module, name = type(value).__module__, type(value).__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def returned(value: Any) -> str:
    """What build_model returned, in words: `None`, `a dict`, `an example.Net`."""
    return "None" if value is None else a_or_an(type_named(value))


def check_compiled(experiment: KerasExperiment, model: Any) -> None:
    """Refuses a model that build_model returned uncompiled (it failed deep in the framework)."""
    if getattr(model, "optimizer", None) is None:
        raise UsageError(
            "--experiment",
            f"{experiment.name}'s build_model returned a model that is not compiled",
            "call model.compile(optimizer=..., loss=..., metrics=[...]) before returning it",
        )


def load(spec: str) -> Experiment:
    """Imports the experiment `spec` names and checks that it defines what the runtime needs."""
    name, module = _import(spec)
    model_fn = getattr(module, "model_fn", None)
    if not callable(model_fn):
        raise UsageError(
            "--experiment",
            f"{_named(module)} ({_source(module)}) defines no model_fn",
            "define model_fn(features, labels, mode, params) returning a "
            "tf.estimator.EstimatorSpec (or, for a Keras experiment, build_model(params))",
        )
    _check_call(module, "model_fn", "model_fn(features, labels, mode, params)", by_name=True)
    train_input_fn, eval_input_fn = _input_fns(module)
    return Experiment(
        name=name,
        model_fn=model_fn,
        train_input_fn=train_input_fn,
        eval_input_fn=eval_input_fn,
        serving_input_receiver_fn=getattr(module, "serving_input_receiver_fn", None),
        **_defined_besides(module),
    )


def checked_data_dir(experiment: Experiment | KerasExperiment, data_dir: str | None) -> str | None:
    """`data_dir`, passed by the experiment's check_data (a ValueError refuses it)."""
    if data_dir is not None and experiment.check_data is not None:
        try:
            experiment.check_data(data_dir)
        except ValueError as error:
            raise UsageError(
                "--data_dir",
                str(error),
                "give the directory that holds the data, or leave --data_dir out for the "
                "experiment's default (the shipped ones train on digits they ship with)",
            ) from None
    return data_dir


def _defined_besides(module: ModuleType) -> dict[str, Any]:
    """What every experiment may define besides its functions: HPARAMS and the two checks."""
    hparams = getattr(module, "HPARAMS", {})
    if not isinstance(hparams, Mapping):
        raise UsageError(
            "--experiment",
            f"{_named(module)}.HPARAMS is {a_or_an(type(hparams).__name__)}, not a dict",
            "define HPARAMS = {'learning_rate': 1e-3, ...}",
        )
    defined: dict[str, Any] = {"hparams": dict(hparams)}
    # Optional, and refused where not a function its call with the probe binds.
    for function, call, refuses, probe in (
        ("check_hparams", "check_hparams(hparams)", "values it cannot train with", {}),
        ("check_data", "check_data(data_dir)", "a --data_dir it cannot train on", ""),
    ):
        check = defined[function] = getattr(module, function, None)
        if check is not None and not callable(check):
            raise UsageError(
                "--experiment",
                f"{_named(module)}.{function} is {a_or_an(type(check).__name__)}, not a function",
                f"define {call}, raising ValueError for {refuses}",
            )
        if check is not None:
            _check_call(module, function, call, probe)
    return defined


def _import(spec: str) -> tuple[str, ModuleType]:
    """The experiment's name and its module, imported."""
    name, path = locate(spec)
    try:
        if path is None:
            return name, importlib.import_module(spec)
        module_spec = importlib.util.spec_from_file_location(f"experiment_{name}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        # The experiment may import its neighbours (experiments/common.py).
        sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
        return name, module
    except Exception as error:
        raise _import_failed(spec, path, error) from None


def _import_failed(spec: str, path: Path | None, error: Exception) -> UsageError:
    # file:line of the error, the import machinery's frames left out.
    if isinstance(error, SyntaxError) and error.filename:
        where = f"{error.filename}:{error.lineno}"
    else:
        frames = traceback.extract_tb(error.__traceback__)
        own = [frame for frame in frames if not frame.filename.startswith("<frozen ")]
        frame = (own or frames)[-1]
        where = f"{frame.filename}:{frame.lineno}"
    return UsageError(
        "--experiment",
        f"importing {path or spec} failed at {where}: {type(error).__name__}: {error}",
        "fix the module; run python on it alone to see the whole traceback",
    )


def _input_fns(module: ModuleType) -> tuple[InputFn, InputFn]:
    input_fn = getattr(module, "input_fn", None)
    if callable(input_fn):
        _check_call(module, "input_fn", "input_fn(mode, params)", "train", {})

        # Estimator passes `params` by name to input functions that take it.
        def train_input_fn(params: Mapping[str, Any]) -> Any:
            return input_fn("train", params)

        def eval_input_fn(params: Mapping[str, Any]) -> Any:
            return input_fn("eval", params)

        return train_input_fn, eval_input_fn
    train, evaluate = (getattr(module, name, None) for name in ("train_input_fn", "eval_input_fn"))
    if callable(train) and callable(evaluate):
        _check_call(module, "train_input_fn", "train_input_fn(params)", by_name=True)
        _check_call(module, "eval_input_fn", "eval_input_fn(params)", by_name=True)
        return train, evaluate
    # Where one of the two is there, the other is named.
    other = "train_input_fn" if callable(evaluate) else "eval_input_fn" if callable(train) else ""
    raise UsageError(
        "--experiment",
        f"{_named(module)} ({_source(module)}) defines no input_fn"
        + (f" and no {other}" if other else ""),
        "define input_fn(mode, params), or train_input_fn(params) and eval_input_fn(params)",
    )


def _check_call(
    module: ModuleType, function: str, call: str, *args: Any, by_name: bool = False
) -> None:
    """Refuses at load a `function` whose call with `args` would fail in training; `by_name`,
    one Estimator calls with each argument it names by name."""
    try:
        signature = inspect.signature(getattr(module, function))
    except (TypeError, ValueError):
        # A builtin or C function without a signature: it is called and judged then.
        return
    try:
        if not by_name:
            signature.bind(*args)
            return
        named = set(signature.parameters) & _ESTIMATOR_ARGUMENTS
        needed = {"features", "params"} if function == "model_fn" else set()
        if needed - named:
            raise TypeError(f"it takes no {' and no '.join(sorted(needed - named))}")
        signature.bind(**dict.fromkeys(named))
    except TypeError as error:
        raise UsageError(
            "--experiment",
            f"{_named(module)}.{function}{signature} cannot be called as {call}: {error}",
            f"define {call}",
        ) from None


def _named(module: ModuleType) -> str:
    """The module as its user named it: a file's stem, else its module name."""
    file = getattr(module, "__file__", None)
    if file and module.__name__ == f"experiment_{Path(file).stem}":
        return Path(file).stem
    return module.__name__


def _source(module: ModuleType) -> str:
    return str(getattr(module, "__file__", None) or module.__name__)


def with_overrides(
    defaults: Mapping[str, Any], overrides: str, check: HparamsCheck | None = None
) -> dict[str, Any]:
    """`defaults` with `--hparams` applied, typed as each default and passed by `check`."""
    values, given = dict(defaults), set()
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        name, equals, text = (piece.strip() for piece in item.partition("="))
        if not equals or not name:
            raise UsageError(
                "--hparams",
                f"has {item!r}, expected name=value",
                "e.g. --hparams=learning_rate=0.01,dropout=0.3",
            )
        if name not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise UsageError(
                "--hparams",
                f"sets {name!r}, which the experiment's HPARAMS does not have",
                f"the experiment's hparams are: {known}",
            )
        if name in given:
            raise UsageError(
                "--hparams", f"sets {name} twice", f"give each hparam once, e.g. {item}"
            )
        given.add(name)
        values[name] = _typed(name, text, defaults[name])
    if check is not None:
        try:
            check(values)
        except ValueError as error:
            raise UsageError(
                "--hparams",
                f"{error}".rstrip(".") or f"{_listed(values)} is refused by check_hparams",
                f"the experiment's check_hparams refused it; its defaults: {_listed(defaults)}",
            ) from None
    return values


def swept(hparams: str, line: str) -> str:
    """--hparams with a sweep file's line after it, the line's values in place of its own."""
    names = {item.partition("=")[0].strip() for item in line.split(",")}
    kept = [item for item in hparams.split(",") if item.partition("=")[0].strip() not in names]
    return ",".join(filter(None, (*kept, line)))


def _listed(hparams: Mapping[str, Any]) -> str:
    return ",".join(f"{name}={value!r}" for name, value in hparams.items())


_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


def _typed(name: str, text: str, default: Any) -> Any:
    # bool is an Integral, and so a Real, too.
    if isinstance(default, bool):
        if text.lower() not in _TRUE + _FALSE:
            raise UsageError(
                "--hparams", f"sets {name}={text!r}, expected true or false", f"e.g. {name}=true"
            )
        return text.lower() in _TRUE
    if isinstance(default, numbers.Real):
        # By the number's kind, not its class: a NumPy default (np.float64, np.int64) is one.
        typed = int if isinstance(default, numbers.Integral) else float
        try:
            value = typed(text)
        except ValueError:
            value = None
        # What TensorFlow and TensorBoard's HParams hold: a finite float, a 64-bit int.
        if (
            value is None
            or (typed is int and abs(value) >= 2**63)
            or (typed is float and not math.isfinite(value))
        ):
            expected = "a finite float" if typed is float else "a 64-bit int"
            raise UsageError(
                "--hparams",
                f"sets {name}={text!r}, expected {expected} like its default {default!r}",
                f"e.g. {name}={default!r}",
            ) from None
        return value
    # A None default is an optional string's.
    if type(default) not in (str, type(None)):
        raise UsageError(
            "--hparams",
            f"sets {name}, whose default {default!r} is {a_or_an(type(default).__name__)}: the "
            "command line sets only bool, int, float and str hparams",
            f"set {name} in the experiment's HPARAMS, or give it a string default the model parses",
        )
    return text


def sweep_lines(path: Path) -> list[str]:
    """The --hparams values of a sweep file, one a line; blank lines and # comments skipped."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            "SWEEP_FILE",
            f"cannot read {path} ({getattr(error, 'strerror', None) or error})",
            "give a text file with one --hparams value a line, e.g. learning_rate=0.001",
        ) from None
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]

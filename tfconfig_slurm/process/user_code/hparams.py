"""An experiment's hparams on the command line (`--hparams=name=value,...` over its HPARAMS)
and a sweep file's lines. No TensorFlow here."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.console import a_or_an

# An experiment's check_hparams(hparams): raises ValueError, saying why, for values it refuses.
HparamsCheck = Callable[[Mapping[str, Any]], None]


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
        kind = int if isinstance(default, numbers.Integral) else float
        try:
            value = kind(text)
        except ValueError:
            value = None
        # What TensorFlow and TensorBoard's HParams hold: a finite float, a 64-bit int.
        if (
            value is None
            or (kind is int and abs(value) >= 2**63)
            or (kind is float and not math.isfinite(value))
        ):
            expected = "a finite float" if kind is float else "a 64-bit int"
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

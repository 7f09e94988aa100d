"""Run by every Python that a command of `with-tfconfig --keras3` starts (with-tfconfig puts
this folder first on the command's PYTHONPATH): once JAX has made its backends' registry, its
CPU collectives go on the address the layout gives the task, $TFCONFIG_SLURM_GLOO_HOST (the
reason is in ../gloo.py). Where $TFCONFIG_SLURM_JAX_NOTES names a file, a Python that used
Keras notes there as it exits whether it joined the step's processes (with-tfconfig says so where
none did: an unchanged script trains a model of its own in each). Then the sitecustomize this
one hides, if any, runs as it would have.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

HOST_VARIABLE = "TFCONFIG_SLURM_GLOO_HOST"
NOTES_VARIABLE = "TFCONFIG_SLURM_JAX_NOTES"
JOINED, ALONE = "joined", "alone"
# Where JAX registers its CPU backend's factory, which gloo.on registers again.
_REGISTRY = "jax._src.xla_bridge"


class _AfterRegistry(importlib.abc.MetaPathFinder):
    """Finds JAX's registry as Python would, and runs gloo.on once it is loaded."""

    def __init__(self, host: str) -> None:
        self._host = host

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != _REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None:
            return spec
        load = loader.exec_module

        def load_then_place(module: ModuleType) -> None:
            load(module)
            try:
                from tfconfig_slurm.backends.keras3 import gloo  # noqa: PLC0415
            except ImportError as error:
                sys.stderr.write(
                    f"with-tfconfig --keras3: JAX's collectives stay on this machine's own "
                    f"address: this Python cannot import tfconfig_slurm ({error}). HINT: run "
                    "the command with the Python tfconfig-slurm is installed in\n"
                )
                return
            from tfconfig_slurm.errors import TfconfigSlurmError  # noqa: PLC0415

            try:
                gloo.on(self._host)
            except TfconfigSlurmError as error:
                # Not a traceback through the script's own import of jax: one line.
                sys.stderr.write(f"with-tfconfig --keras3: {error.one_line()}\n")

        loader.exec_module = load_then_place  # type: ignore[method-assign]
        return spec


def _note_joined(path: str) -> None:
    """Appends to `path` whether this Python, where it used Keras, joined other processes
    (jax.distributed, which keras.distribution.initialize() calls: its coordinator's address
    stays set after the shutdown JAX makes at exit, before this runs). One that only touched
    JAX trained no model to speak of."""
    if "keras" not in sys.modules:
        return
    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    joined = getattr(state, "coordinator_address", None) is not None
    with contextlib.suppress(OSError), open(path, "a") as notes:
        notes.write(f"{JOINED if joined else ALONE}\n")


def _run_the_hidden_one() -> None:
    """The next sitecustomize on the path, which this one's name hides."""
    here = Path(__file__).resolve().parent
    rest = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


# Only as Python's own sitecustomize: with-tfconfig imports this module for its names.
if __name__ == "sitecustomize":
    if os.environ.get(HOST_VARIABLE):
        sys.meta_path.insert(0, _AfterRegistry(os.environ[HOST_VARIABLE]))
    if os.environ.get(NOTES_VARIABLE):
        atexit.register(_note_joined, os.environ[NOTES_VARIABLE])
    _run_the_hidden_one()

"""The task lifecycle (process/lifecycle.py) around a backend that imports no TensorFlow: what
the run's state and the task's end are, whatever the backend does. No TensorFlow, no SLURM."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import pytest

from tfconfig_slurm.process import claim, lifecycle, preemption
from tfconfig_slurm.process.place import Place


class Backend:
    """A backend whose training takes no step: it ends the task, or (a bug) returns."""

    experiment = "nothing"
    hparams: Mapping[str, Any] = {}
    train_steps = 10

    def __init__(self, *, ends: bool) -> None:
        self._ends = ends

    def checkpoint_step(self) -> int | None:
        return None

    def start_details(self) -> tuple[str, ...]:
        return ()

    def write_hparams(self, hparams: Mapping[str, Any], trial_id: str) -> None:
        pass

    def train(self, end: Callable[[lifecycle.Ending], Any]) -> Any:
        return end(lifecycle.Ending(None, result="trained")) if self._ends else "returned"


def task(model_dir: Path) -> lifecycle.TaskRun:
    return lifecycle.TaskRun(
        place=Place(role=None, node="here", gpus="any", layout_source="TF_CONFIG"),
        model_dir=model_dir,
        naming=claim.CLI_NAMING,
        stop=preemption.StopRequest(),
        stop_policy=preemption.StopPolicy((), 3),
        environ={},
        job=None,
    )


def state(model_dir: Path) -> str:
    return str(json.loads((model_dir / "state.json").read_text())["state"])


def test_a_backend_that_ends_its_task_returns_its_result_and_the_run_is_done(
    tmp_path: Path,
) -> None:
    result = lifecycle.run(task(tmp_path), lifecycle.PARAMETER_SERVERS, lambda: Backend(ends=True))
    assert result == "trained" and state(tmp_path) == "done"


def test_a_backend_that_returns_without_ending_fails_the_run_and_says_so(tmp_path: Path) -> None:
    """It used to leave state.json at "running" and the task's exit 0."""
    with pytest.raises(lifecycle.BackendError, match="returned from its training without"):
        lifecycle.run(task(tmp_path), lifecycle.PARAMETER_SERVERS, lambda: Backend(ends=False))
    assert state(tmp_path) == "failed"

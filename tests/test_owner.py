"""What the run's owner says in state.json across attempts (process/records/attempts.py and
reports.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tfconfig_slurm.process.records.attempts import RunOwner
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.records.run_dir import RunDir


def test_a_resume_with_other_hparams_names_them_and_each_attempt_is_kept(tmp_path: Path) -> None:
    first = RunOwner(tmp_path, "mnist_deep", {"learning_rate": 0.001, "dropout": 0.5}, None, "7")
    assert first.first_start()
    assert first.changed_hparams() == {}
    first.say(RunState.RUNNING, None)
    first.say(RunState.STOPPED, 200, signal="SIGUSR1")

    same = RunOwner(tmp_path, "mnist_deep", {"dropout": 0.5, "learning_rate": 0.001}, None, "7")
    assert same.changed_hparams() == {}
    other = RunOwner(tmp_path, "mnist_deep", {"learning_rate": 0.01, "dropout": 0.5}, None, "7")
    assert not other.first_start()
    assert other.changed_hparams() == {"learning_rate": (0.001, 0.01)}
    other.say(RunState.RUNNING, 200)

    state = json.loads(RunDir(tmp_path).state.read_text())
    assert state["state"] == "running"
    assert state["hparams"] == {"learning_rate": 0.01, "dropout": 0.5}
    assert [attempt["hparams"]["learning_rate"] for attempt in state["attempts"]] == [0.001, 0.01]
    assert [attempt["job_id"] for attempt in state["attempts"]] == ["7", "7"]
    assert state["job_id"] == "7"
    assert "signal" not in state


def test_a_state_json_that_cannot_be_read_is_set_aside_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new attempt wrote over a cut-short state.json without a word: the earlier attempts
    it held were gone."""
    run = RunDir(tmp_path)
    run.state.write_text('{"state": "stopped", "attempts": [{"job_id": "7"')
    with caplog.at_level(logging.WARNING):
        RunOwner(tmp_path, "mnist_deep", {}, None, "8").say(RunState.RUNNING, 200)
    assert run.unreadable_state.read_text() == '{"state": "stopped", "attempts": [{"job_id": "7"'
    assert [each["job_id"] for each in json.loads(run.state.read_text())["attempts"]] == ["8"]
    assert f"{run.state} cannot be read (cut short or garbled): set aside as " in caplog.text
    # A readable one is carried on, not set aside.
    RunOwner(tmp_path, "mnist_deep", {}, None, "9").say(RunState.RUNNING, 300)
    assert [each["job_id"] for each in json.loads(run.state.read_text())["attempts"]] == ["8", "9"]

"""What the run's owner says in state.json across attempts (process/records/attempts.py and
reports.py)."""

from __future__ import annotations

import json
from pathlib import Path

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

"""The run's first-failure record (process/records/failure.py): the first writer of an attempt
wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.records import failure

CLUSTER = {"chief": ("node1:2222",), "ps": ("node1:2223",), "worker": ("node2:2222",)}


def role(name: str, run_id: str) -> ClusterRole:
    return ClusterRole(cluster=CLUSTER, role=name, index=0, run_id=run_id)


def test_the_first_failure_of_an_attempt_stays_and_a_new_attempt_has_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(failure._TASK, "attached", None)
    failure.attach(tmp_path, role("ps", "7.0.0"), "node1")
    silent = "stopped answering: killed, or its node cut off"
    assert failure.record_lost("worker 0", "node2:2222", silent) is None
    # A second watcher's loss is not recorded: it learns the failure that came first.
    failure.attach(tmp_path, role("worker", "7.0.0"), "node2")
    before = failure.record_lost("ps 0", "node1:2223", "stopped answering")
    assert before is not None and before.task == "worker 0"
    failure.attach(tmp_path, role("chief", "7.0.0"), "node1")
    with pytest.raises(ValueError), failure.recording_errors():
        raise ValueError("too late to be first")
    first = failure.read(tmp_path, "7.0.0")
    assert first is not None
    assert first.line() == (
        "worker 0 on node2: stopped answering: killed, or its node cut off, seen by ps 0"
    )

    failure.attach(tmp_path, role("chief", "7.0.1"), "node1")
    with pytest.raises(ValueError), failure.recording_errors():
        raise ValueError("bad\nbatch")
    requeued = failure.latest(tmp_path)
    assert (
        requeued is not None
        and requeued.line() == "chief 0 on node1: ValueError: bad batch (exit 1)"
    )
    assert sorted(path.name for path in (tmp_path / "failures").iterdir()) == [
        "7.0.0.json",
        "7.0.1.json",
    ]


def test_a_single_process_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failure._TASK, "attached", None)
    failure.attach(tmp_path, None, "node1")
    with pytest.raises(ValueError), failure.recording_errors():
        raise ValueError("on its own console")
    assert not (tmp_path / "failures").exists()

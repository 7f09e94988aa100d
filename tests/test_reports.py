"""The evaluator's result as the chief waits for it (process/records/reports.py): its metrics, or,
at once, word that none will come (it gave up on the final checkpoint, or its failure is
recorded for this run), rather than 600 s of waiting. No TensorFlow."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.records import reports

RUN = {"run": "41.0.0", "train_steps": 200}


@pytest.fixture(autouse=True)
def _short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that a test returning by its end would say "none within 20 s".
    monkeypatch.setattr(timing, "EVALUATOR_WAIT_SECONDS", 20.0)


def test_the_evaluator_s_metrics_of_this_run_are_taken(tmp_path: Path) -> None:
    reports.write_evaluator_result(tmp_path, {**RUN, "run": "40.0.0"}, {"accuracy": 0.1})
    reports.write_evaluator_result(tmp_path, RUN, {"accuracy": 0.9, "global_step": 200})
    assert reports.evaluator_result(tmp_path, RUN) == {"accuracy": 0.9, "global_step": 200.0}


def test_an_evaluator_that_gave_up_on_the_final_checkpoint_is_not_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reports.write_evaluator_gave_up(tmp_path, RUN, "ckpt-200: DataLossError")
    with caplog.at_level(logging.WARNING):
        assert reports.evaluator_result(tmp_path, RUN) is None
    assert (
        "the evaluator gave no result for step 200 (it gave up: ckpt-200: DataLossError); "
        "evaluating the final checkpoint here"
    ) in caplog.text


def test_an_evaluator_whose_failure_is_recorded_is_not_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its wrapper recorded it (killed, or its script raised) while the coordinator trained."""
    (tmp_path / "failures").mkdir()
    failed = {"task": "evaluator 0", "node": "node2", "what": "its command was killed by "
              "SIGKILL", "exit_status": 137, "seen_by": None, "time": time.time()}  # fmt: skip
    (tmp_path / "failures" / "41.0.0.json").write_text(json.dumps(failed))
    with caplog.at_level(logging.WARNING):
        assert reports.evaluator_result(tmp_path, RUN) is None
    assert (
        "(it failed: evaluator 0 on node2: its command was killed by SIGKILL (exit 137))"
        in caplog.text
    )


def test_trainers_that_never_reported_are_said_missing_from_the_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's tasks that each made a model directory of their own: the chief's summary
    counted its own throughput alone, silently."""
    monkeypatch.setattr(timing, "REPORT_WAIT_SECONDS", 0.3)
    chief = ClusterRole({"chief": ("a:1",), "worker": ("b:1",)}, "chief", 0, run_id="41.0.0")
    reports.write_trainer_report(tmp_path, chief, RUN, 100.0)
    with caplog.at_level(logging.WARNING):
        found = reports.trainer_reports(tmp_path, 2, RUN)
    assert [report["examples_per_sec"] for report in found] == [100.0]
    assert "1 of the 2 trainers reported their throughput into " in caplog.text
    assert "HINT: give every task the same model directory" in caplog.text


def test_a_file_written_whole_keeps_the_umask_s_mode_and_leaves_the_umask_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#52: the umask is the process's, shared by every thread; set to 0 for a moment (as
    write_json_atomically did at every progress line, on the training thread), a watch thread
    writing a failure record meanwhile made it world-writable. Each file is made with its mode,
    the kernel applying the umask, and flushed to the disk before its rename."""
    umask = os.umask(0o027)
    os.umask(umask | 0o027)
    calls: list[int] = []
    synced: list[int] = []
    fsync = os.fsync

    def umask_set(mask: int) -> int:
        calls.append(mask)
        return 0o027

    def synced_to_disk(descriptor: int) -> None:
        synced.append(descriptor)
        fsync(descriptor)

    monkeypatch.setattr(os, "umask", umask_set)
    monkeypatch.setattr(os, "fsync", synced_to_disk)
    try:
        reports.write_json_atomically(tmp_path / "state.json", {"state": "training"})
    finally:
        monkeypatch.undo()
        os.umask(umask)
    assert calls == []
    assert json.loads((tmp_path / "state.json").read_text()) == {"state": "training"}
    assert (tmp_path / "state.json").stat().st_mode & 0o777 == 0o666 & ~(umask | 0o027)
    # The file's data, and its directory's entry once renamed.
    assert len(synced) >= 2
    assert [path.name for path in tmp_path.iterdir()] == ["state.json"]

"""One model directory, one run: the lock a run holds, who shares it, and when it is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import run_module, wait_until
from tfconfig_slurm.cluster.step import read_slurm_job
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.records import claim
from tfconfig_slurm.process.records.claim import Holder
from tfconfig_slurm.process.records.run_dir import RunDir

HOST = socket.gethostname()


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process on this host, standing for another run."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_a_second_run_is_refused_naming_the_holder(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    claim.claim(tmp_path / "run", Holder(job=None, host=HOST, pid=other_process.pid))
    with pytest.raises(UsageError) as raised:
        claim.claim(tmp_path / "run", claim.this_holder(None))
    assert raised.value.culprit == "--experiment_id"
    assert f"held by another run, process {other_process.pid} on {HOST}" in raised.value.problem
    assert "give this run its own --experiment_id" in raised.value.hint


def test_the_tasks_of_a_job_and_its_requeued_run_share_it(tmp_path: Path) -> None:
    first = claim.claim(tmp_path, claim.this_holder(read_slurm_job({"SLURM_JOB_ID": "77"})))
    again = claim.this_holder(read_slurm_job({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}))
    assert claim.claim(tmp_path, Holder(job="77", host="node2", pid=1)).holder.job == "77"
    assert claim.claim(tmp_path, again).lock == first.lock
    # An array task is its own job: the array's other tasks are other runs.
    array_task = claim.this_holder(
        read_slurm_job(
            {"SLURM_JOB_ID": "78", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1"}
        )
    )
    assert array_task.job == "77_1"


def test_a_lock_whose_process_ended_is_taken_over(tmp_path: Path) -> None:
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    claim.claim(tmp_path, Holder(job=None, host=HOST, pid=int(ended.stdout)))
    mine = claim.claim(tmp_path, claim.this_holder(None))
    assert json.loads(mine.lock.read_text())["pid"] == os.getpid()


def test_a_lock_from_another_host_is_held_until_it_is_stale(tmp_path: Path) -> None:
    claim.claim(tmp_path, Holder(job=None, host="node9", pid=1))
    with pytest.raises(UsageError, match="process 1 on node9"):
        claim.claim(tmp_path, claim.this_holder(None))
    long_ago = time.time() - timing.STALE_SECONDS - 1
    os.utime(RunDir(tmp_path).lock, (long_ago, long_ago))
    claim.claim(tmp_path, claim.this_holder(None))


def test_a_job_slurm_cannot_be_asked_about_is_held_until_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no squeue
    claim.claim(tmp_path, Holder(job="77", host="node1", pid=1))
    with pytest.raises(UsageError, match="SLURM job 77"):
        claim.claim(tmp_path, claim.this_holder(read_slurm_job({"SLURM_JOB_ID": "78"})))


def test_renewal_and_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "RENEW_SECONDS", 0.05)
    held = claim.claim(tmp_path, claim.this_holder(None))
    long_ago = time.time() - 1000
    os.utime(held.lock, (long_ago, long_ago))
    held.renew()
    assert wait_until(lambda: time.time() - held.lock.stat().st_mtime < 5, 10.0)
    held.release()
    assert not held.lock.exists()


def test_a_file_system_without_hard_links_still_takes_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_process: subprocess.Popen[bytes]
) -> None:
    def no_links(source: str, target: Path) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    held = claim.claim(tmp_path, Holder(job=None, host=HOST, pid=other_process.pid))
    assert json.loads(held.lock.read_text())["pid"] == other_process.pid
    with pytest.raises(UsageError, match=f"process {other_process.pid} on"):
        claim.claim(tmp_path, claim.this_holder(None))


def test_release_leaves_a_lock_another_run_took_over(tmp_path: Path) -> None:
    held = claim.claim(tmp_path, claim.this_holder(None))
    (RunDir(tmp_path).lock).write_text(json.dumps({"job": "9", "host": "n", "pid": 1}))
    held.release()
    assert (RunDir(tmp_path).lock).exists()


def test_the_runtime_refuses_a_held_directory_with_one_line(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    """At once: before the experiment (which this one fails to be) and TensorFlow load."""
    claim.claim(tmp_path / "mine", Holder(job=None, host=HOST, pid=other_process.pid))
    (tmp_path / "mine.py").write_text("raise RuntimeError('the experiment was loaded')\n")
    result = run_module(
        "tfconfig_slurm.run", f"--experiment={tmp_path / 'mine.py'}", f"--output_root={tmp_path}"
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "tfconfig-slurm-run: --experiment_id: "
        f"{tmp_path / 'mine'} is held by another run, process {other_process.pid}"
    )
    assert sorted(path.name for path in (tmp_path / "mine").iterdir()) == ["run.lock"]

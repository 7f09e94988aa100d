"""A trainer that makes no step (process/task/hang_watch.py): its bound, where it waits, which
hung task is to blame, and a process found hung, its stacks logged. No TensorFlow, no SLURM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests import fake_backend
from tests.cli import PACED, REPOSITORY, wait_until
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.hang_watch import Account


def test_the_bound_is_the_flag_else_the_variable_else_five_minutes() -> None:
    assert hang_watch.seconds_from(12.0, {hang_watch.VARIABLE: "99"}) == 12.0
    assert hang_watch.seconds_from(None, {hang_watch.VARIABLE: "99"}) == 99.0
    assert hang_watch.seconds_from(None, {hang_watch.VARIABLE: "0"}) == 0.0
    assert hang_watch.seconds_from(None, {}) == 300.0
    for bad in ("soon", "-5", "nan"):
        with pytest.raises(UsageError, match=f"TFCONFIG_SLURM_HANG_TIMEOUT: is '{bad}'"):
            hang_watch.seconds_from(None, {hang_watch.VARIABLE: bad})


def test_the_bound_grows_with_the_slowest_step_and_is_three_times_it_for_the_first() -> None:
    watch = hang_watch.Watch(30.0, None, Path("."), "node1")
    try:
        watch.beat(0, first=True)
        assert watch.bound() == 90.0
        watch.beat(1)
        assert watch.bound() == 30.0
        watch._stepped_at -= 5.0  # a step of 5 s
        watch.beat(2)
        assert 50.0 <= watch.bound() < 51.0
    finally:
        # Its thread would find this process, pytest's, hung and end it.
        watch.pause()


def account(task: str, stepped_at: float, *, own: bool) -> Account:
    return Account(task, "node1", 40, stepped_at, "here.py:1 in f", own)


def test_the_one_waiting_in_its_own_code_is_blamed_else_the_oldest_step_said_so() -> None:
    chief = account("chief 0", 100.0, own=False)
    worker = account("worker 0", 101.0, own=True)
    other = account("worker 1", 99.0, own=False)
    assert hang_watch.blame([chief, worker, other]) == (worker, "")
    blamed, rule = hang_watch.blame([chief, other])
    assert blamed == other
    assert rule == "; of the hung tasks, its last step is the oldest"
    both = account("worker 2", 100.5, own=True)
    blamed, rule = hang_watch.blame([worker, both, chief])
    assert blamed == both
    assert rule == "; of the tasks that wait in their own code, its last step is the oldest"
    assert hang_watch.blame([chief]) == (chief, "")


def users_wait(release: threading.Event) -> None:
    release.wait()


def test_a_thread_waiting_in_the_user_s_code_is_where_the_process_waits() -> None:
    release = threading.Event()
    waiting = threading.Thread(target=users_wait, args=(release,))
    waiting.start()
    try:
        time.sleep(0.2)
        where, own = hang_watch.where_it_waits(sys._current_frames())
    finally:
        release.set()
        waiting.join()
    assert own
    assert where.startswith("test_hang_watch.py:") and where.endswith(" in users_wait")


# A single process whose data blocks at its 4th step.
HANGS = textwrap.dedent("""
    import time
    from pathlib import Path
    from tfconfig_slurm.process.task import hang_watch

    def batches():
        for step in range(1, 100):
            if step == 4:
                time.sleep(600)
            yield step

    hang_watch.watch(1.0, None, Path("."), "node1")
    hang_watch.began(0)
    for step in batches():
        time.sleep(0.01)
        hang_watch.stepped(step)
""")


def test_a_process_that_makes_no_step_is_hung_its_stacks_logged(tmp_path: Path) -> None:
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    started = time.monotonic()
    ended = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ended.returncode == ExitStatus.HUNG, ended.stderr
    assert time.monotonic() - started < 30
    assert re.search(
        r"the process: hung: no step for [12] s since global step 3 \(its bound: 1 s", ended.stderr
    )
    assert "the process, thread MainThread (most recent call last):" in ended.stderr
    assert "line 9, in batches\n    time.sleep(600)" in ended.stderr
    assert "the run hung (first to fail: the process on node1: hung at global step 3:" in (
        ended.stderr
    )
    assert "waiting in its own code (hangs.py:9 in batches)" in ended.stderr


def runtime(tmp_path: Path, *flags: str, hang: str) -> subprocess.Popen[str]:
    """The runtime in one process on the fake backend (tests/fake_backend.py), hanging as
    `hang` (fake_backend.HANG_AS) says."""
    return subprocess.Popen(
        [sys.executable, "-m", "tfconfig_slurm.run", f"--experiment={PACED}",
         f"--output_root={tmp_path}", "--train_steps=1000", *flags],
        env={"PATH": os.environ["PATH"], **fake_backend.environ(**{fake_backend.HANG_AS: hang})},
        cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_runtime_process_that_hangs_ends_and_its_run_says_why(tmp_path: Path) -> None:
    process = runtime(tmp_path, "--hang_timeout=2", hang="single@8")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == ExitStatus.HUNG, stderr[-3000:]
    assert "a single process: hung: no step for" not in stderr
    assert re.search(r"the process: hung: no step for [23] s since global step 8 ", stderr)
    assert "fake_backend.py" in stderr and "in _hang" in stderr
    state = json.loads((tmp_path / "paced" / "state.json").read_text())
    assert state["state"] == "failed"
    assert state["error"].startswith("the process hung at global step 8: no step for "), state


def test_a_stop_a_process_cannot_take_at_a_step_ends_it_stopped(tmp_path: Path) -> None:
    """#55 item 4: with the hang watch off, SIGTERM to a process whose data blocks for ever
    ends it within timing.STOP_GRACE_SECONDS and a few more, stopped, its stacks logged (the
    docs' promise for a single process: within 30 s of SIGTERM)."""
    process = runtime(tmp_path, "--hang_timeout=0", hang="single@8")
    try:
        # Its first step keeps progress.json; its 8th comes 0.35 s later.
        assert wait_until((tmp_path / "paced" / "progress.json").exists, 30)
        time.sleep(1)
        process.send_signal(signal.SIGTERM)
        told = time.monotonic()
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    took = time.monotonic() - told
    print(f"ended {took:.1f} s after SIGTERM")
    assert timing.STOP_GRACE_SECONDS <= took < 30
    assert (
        "told to stop on SIGTERM 20 s ago, and its training has taken no step for 20 s: it "
        "cannot stop at a step with a checkpoint, and stops now"
    ) in stderr
    assert "in _hang" in stderr
    state = json.loads((tmp_path / "paced" / "state.json").read_text())
    assert (state["state"], state["signal"]) == ("stopped", "SIGTERM"), state
    assert process.returncode == 0, stderr[-3000:]


@pytest.mark.tensorflow
def test_an_estimator_process_whose_input_hangs_is_named_with_its_stack(tmp_path: Path) -> None:
    """Estimator's hooks say its steps to the watch: its input blocks at the 30th batch, in
    the Python function tf.data runs for it on a thread of its own."""
    ended = subprocess.run(
        [sys.executable, "-m", "tfconfig_slurm.run", f"--experiment={PACED}",
         f"--output_root={tmp_path}", "--train_steps=1000", "--hang_timeout=3"],
        env={"PATH": os.environ["PATH"], "PACED_HANG_AT": "30"},
        cwd=REPOSITORY, check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ended.returncode == ExitStatus.HUNG, ended.stderr[-3000:]
    said = re.search(
        r"the process: hung: no step for [34] s since global step (\d+) ", ended.stderr
    )
    assert said is not None and 20 <= int(said[1]) <= 30, ended.stderr[-3000:]
    assert "waiting in its own code (paced.py:" in ended.stderr
    assert "in _paced_or_hung\n    time.sleep(3600)" in ended.stderr

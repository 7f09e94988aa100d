"""Running the package's commands as a user does: a fresh process, a given environment."""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
# An experiment whose steps cost next to no CPU (tests/fixtures/paced.py), for the tests that
# train until something happens to the run.
PACED = REPOSITORY / "tests" / "fixtures" / "paced.py"
# Its Keras twin (tests/fixtures/paced_keras.py), for the lifecycle tests of a Keras run.
PACED_KERAS = REPOSITORY / "tests" / "fixtures" / "paced_keras.py"
# And its Keras 3 twin, on JAX (tests/fixtures/paced_keras3.py).
PACED_KERAS3 = REPOSITORY / "tests" / "fixtures" / "paced_keras3.py"
SHARDED_KERAS3 = REPOSITORY / "tests" / "fixtures" / "sharded_keras3.py"
# The Python of Keras 3 on JAX (make venv-keras3), which the tests marked keras3 start; the
# one this variable names instead (tests/lanes: .venv-keras3-oldest's, on the oldest JAX).
KERAS3_PYTHON = REPOSITORY / (
    os.environ.get("TFCONFIG_SLURM_TEST_KERAS3_PYTHON") or ".venv-keras3/bin/python"
)


def run_module(
    module: str,
    *arguments: str,
    environ: dict[str, str] | None = None,
    python_flags: tuple[str, ...] = (),
    timeout: float = 120,
    python: str | Path = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """`python -m module arguments` with only `environ` (plus PATH) as its environment."""
    return subprocess.run(
        [str(python), *python_flags, "-m", module, *arguments],
        env={"PATH": os.environ["PATH"], **(environ or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPOSITORY,
        check=False,
    )


@contextlib.contextmanager
def tensorboard(root: Path) -> Iterator[str]:
    """`launch/tensorboard root` on a free port, every run loaded before it serves; yields its
    URL."""
    server = subprocess.Popen(
        [str(REPOSITORY / "launch" / "tensorboard"), str(root),
         "--load_fast=false", "--reload_task=blocking", "--reload_interval=0"],
        env={
            "PATH": os.environ["PATH"],
            "TFCONFIG_SLURM_PYTHON": sys.executable,
            "TENSORBOARD_PORT": "0",
        },
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        # The script's ssh line names the port it chose; TensorBoard names it once it serves.
        tunnel = re.search(r"ssh -N -L (\d+):localhost:(\d+) \S+", server.stderr.readline())
        assert tunnel is not None and tunnel[1] == tunnel[2], "no ssh line naming the port"
        lines = iter(server.stderr.readline, "")
        url = next(
            (found[0] for line in lines if (found := re.findall(r"http://localhost:\d+/", line))),
            None,
        )
        assert url == f"http://localhost:{tunnel[1]}/", f"TensorBoard serves at {url}"
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def checkpoint_step(model_dir: Path) -> int:
    """The step of a model directory's latest checkpoint (Estimator's model.ckpt-N, Keras's
    ckpt-N, Keras 3's ckpt-N.weights.h5)."""
    latest = re.search(
        r'^model_checkpoint_path: "(?:model\.)?ckpt-(\d+)[."]',
        (model_dir / "checkpoint").read_text(),
        re.M,
    )
    assert latest is not None
    return int(latest.group(1))


def saved_step(model_dir: Path) -> int:
    """checkpoint_step, 0 before the first checkpoint."""
    return checkpoint_step(model_dir) if (model_dir / "checkpoint").exists() else 0


def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Polls `done` until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def wait_for(read: Callable[[], str], pattern: str, seconds: float) -> re.Match[str]:
    """Polls `read()` until `pattern` appears in what it returns."""
    if not wait_until(lambda: re.search(pattern, read()) is not None, seconds):
        pytest.fail(f"no {pattern!r} within {seconds:.0f} s:\n{read()[-3000:]}")
    found = re.search(pattern, read())
    assert found is not None
    return found


def ended_within(process: subprocess.Popen[Any], seconds: float) -> None:
    """Fails the test where `process` still runs `seconds` from now: it hangs (how fast a
    fault ends a job is bench/faults.py's to measure)."""
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the job still ran {seconds:.0f} s after the kill: it hangs")


def highest_step(log: str) -> int:
    """The highest global step trainers logged (with --log_every_steps=1, the last reached)."""
    return max(map(int, re.findall(r"step (\d+): loss \S+, [\d.]+ examples/s", log)), default=0)


def read_logs(folder: Path) -> str:
    """Every task's log in a folder, in the order of their names."""
    return "".join(path.read_text(errors="replace") for path in sorted(folder.glob("*.log")))


def free_port_block(count: int) -> int:
    """The first of `count` consecutive loopback ports that are free now: for a step of tasks
    on this host, each on base + its local id. Above Linux's ephemeral range (to 60999) and the
    runtime's derived bases (10000-32767), which other tests' tasks take as they start (CI: a
    block taken there was found in use), and each pytest worker in a range of its own."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    span = (65536 - 61000) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for _ in range(100):
        base = random.randrange(61000 + worker * span, 61000 + (worker + 1) * span - count)
        with contextlib.ExitStack() as holders:
            try:
                for port in range(base, base + count):
                    holders.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise AssertionError(f"no {count} consecutive free ports")

"""Running the package's commands as a user does: a fresh process, a given environment."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent


def run_module(
    module: str,
    *arguments: str,
    environ: dict[str, str] | None = None,
    python_flags: tuple[str, ...] = (),
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`python -m module arguments` with only `environ` (plus PATH) as its environment."""
    return subprocess.run(
        [sys.executable, *python_flags, "-m", module, *arguments],
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

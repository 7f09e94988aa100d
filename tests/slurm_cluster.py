"""The test suite's real SLURM cluster (tests/slurm/cluster), as a session-scoped fixture.

Where it cannot start (not root, no apt), the tests that need it skip with the reason; with
TFCONFIG_SLURM_REQUIRE_SLURM=1, as in CI, that is a failure instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli import REPOSITORY

SCRIPT = REPOSITORY / "tests" / "slurm" / "cluster"
STATE = Path("/tmp/tfconfig-slurm-cluster")
NODES = ("node1", "node2", "node3")
# A pending srun or sbatch --wait blocks forever: every call has a deadline.
CALL_SECONDS = 240.0


@dataclass(frozen=True)
class SlurmCluster:
    """Runs Slurm's client commands against the test cluster."""

    conf: Path

    def environ(self, **extra: str) -> dict[str, str]:
        """What a user's shell would hold: the cluster's config, this Python first on PATH."""
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        return {
            "PATH": path,
            "HOME": os.environ.get("HOME", "/root"),
            "SLURM_CONF": str(self.conf),
            "TFCONFIG_SLURM_PYTHON": sys.executable,
            **extra,
        }

    def run(
        self,
        command: Sequence[str],
        cwd: Path = REPOSITORY,
        timeout: float = CALL_SECONDS,
        **extra: str,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command),
            env=self.environ(**extra),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (there is no accounting database to ask sacct)."""
        shown = self.run(["scontrol", "show", "job", "--oneliner", job_id])
        assert shown.returncode == 0, shown.stderr
        return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))

    def node_pids(self) -> dict[str, list[int]]:
        """The processes still running on each node, found by its network namespace."""
        found = {}
        for node in NODES:
            listed = subprocess.run(
                ["ip", "netns", "pids", f"tfs-{node}"], capture_output=True, text=True, check=True
            )
            found[node] = [int(pid) for pid in listed.stdout.split()]
        return found

    def task_pid(self, rank: int) -> int:
        """The pid of a running task of the tfconfig_slurm runtime, by its rank in the step."""
        for pids in self.node_pids().values():
            for pid in pids:
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if f"SLURM_PROCID={rank}".encode() in environ and "tfconfig_slurm.run" in (
                    _command_line(pid)
                ):
                    return pid
        raise AssertionError(f"no task of rank {rank} runs on any node")

    def task_pids(self) -> dict[str, list[str]]:
        """Processes on the nodes other than slurmd itself: what jobs left behind."""
        left = {}
        for node, pids in self.node_pids().items():
            commands = [_command_line(pid) for pid in pids]
            left[node] = [command for command in commands if command and "slurmd" not in command]
        return left


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _unavailable(reason: str) -> None:
    if os.environ.get("TFCONFIG_SLURM_REQUIRE_SLURM") == "1":
        pytest.fail(f"TFCONFIG_SLURM_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The cluster, started for the session unless it was already up (then left up)."""
    if os.geteuid() != 0:
        _unavailable("the SLURM test cluster needs root (network namespaces, Slurm daemons)")
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if was_up.returncode != 0:
        started = subprocess.run(
            [str(SCRIPT), "up"], capture_output=True, text=True, timeout=600, check=False
        )
        if started.returncode != 0:
            _unavailable(f"could not start the SLURM test cluster: {started.stderr.strip()}")
    try:
        yield SlurmCluster(STATE / "slurm.conf")
    finally:
        if was_up.returncode != 0:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120, check=False)

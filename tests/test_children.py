"""The supervisors' children (with-tfconfig's command, the local cluster's tasks): they die with
a supervisor killed outright, a signal reaches what they started, and a stop kills what ignores
SIGTERM once its grace is over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli import REPOSITORY, wait_until
from tfconfig_slurm.process import exits
from tfconfig_slurm.process.supervision import children

# A supervisor that starts a shell that starts a sleep, and says both pids.
SUPERVISOR = """
import os, sys, time
from tfconfig_slurm.process.supervision import children
group = children.Group(own_sessions=sys.argv[1] == "own")
shell = group.start(["sh", "-c", "sleep 300 & echo $!; wait"], os.environ, capture=True)
print(shell.pid, shell.stdout.readline().strip(), flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone but for its parent's wait.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize("sessions", ["own", "shared"])
def test_a_child_dies_with_its_supervisor_killed_outright(sessions: str) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, sessions],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPOSITORY,
    )
    assert supervisor.stdout is not None
    shell, sleep = map(int, supervisor.stdout.readline().split())
    assert alive(shell)
    supervisor.kill()
    supervisor.wait()
    assert wait_until(lambda: not alive(shell), 5.0)
    # The shell's own child is only orphaned: the runtime's tasks end theirs themselves.
    os.kill(sleep, signal.SIGKILL)


def test_a_signal_reaches_what_a_child_in_its_own_session_started() -> None:
    group = children.Group(own_sessions=True)
    shell = group.start(["sh", "-c", "sleep 300 & echo $!; wait"], os.environ, capture=True)
    assert shell.stdout is not None
    sleep = int(shell.stdout.readline())
    group.signal(signal.SIGTERM)
    assert shell.wait(timeout=5) == -signal.SIGTERM
    assert wait_until(lambda: not alive(sleep), 5.0)


def test_a_stop_kills_a_child_that_ignores_sigterm_after_its_grace() -> None:
    group = children.Group(own_sessions=True)
    stubborn = group.start(
        ["sh", "-c", "trap '' TERM; echo ready; sleep 300 & wait"], os.environ, capture=True
    )
    polite = group.start(["sleep", "300"], os.environ)
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline() == "ready\n"
    began = time.monotonic()
    group.stop(1.0)
    assert (stubborn.returncode, polite.returncode) == (-signal.SIGKILL, -signal.SIGTERM)
    # The stubborn one was given its grace before SIGKILL.
    assert time.monotonic() - began >= 1.0
    assert exits.exit_status(stubborn.returncode) == 128 + signal.SIGKILL
    assert exits.how_it_ended(stubborn.returncode) == "was killed by SIGKILL"

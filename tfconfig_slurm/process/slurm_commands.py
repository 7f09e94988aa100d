"""SLURM's client commands as the runtime runs them: each with a deadline, a failure told as
one sentence. Only here is a job put in the queue (tests/test_imports.py holds it)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tfconfig_slurm.process import timing


def run(
    command: Sequence[str],
    seconds: float | None = timing.SLURM_COMMAND_SECONDS,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str] | None:
    """Runs the command, its output captured; None where it cannot be run or times out."""
    try:
        return subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=seconds,
            check=False,
            env=None if environ is None else dict(environ),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def failure(command: Sequence[str], seconds: float = timing.SLURM_COMMAND_SECONDS) -> str:
    """Runs the command; "" when it succeeded, else what went wrong."""
    result = run(command, seconds)
    if result is None:
        return f"{command[0]} cannot be run here (not installed, or no answer in {seconds:.0f} s)"
    if result.returncode:
        return result.stderr.strip() or f"exit status {result.returncode}"
    return ""


class Submitted(NamedTuple):
    """What sbatch did: the new job's id, or "" and why not; its own lines and exit status."""

    job_id: str
    problem: str
    said: str = ""
    status: int | None = None


def sbatch_command(arguments: Sequence[str]) -> list[str]:
    """sbatch's command line for `arguments`, which sbatch() runs (a --dry_run prints it)."""
    return ["sbatch", "--parsable", *arguments]


def sbatch(
    arguments: Sequence[str],
    environ: Mapping[str, str] | None = None,
    seconds: float | None = timing.SLURM_COMMAND_SECONDS,
) -> Submitted:
    """Submits a job (`sbatch --parsable ARGUMENTS`), given `seconds` (None: no limit)."""
    result = run(sbatch_command(arguments), seconds, environ)
    if result is None:
        waited = "" if seconds is None else f", or no answer in {seconds:.0f} s"
        return Submitted("", f"sbatch cannot be run here (not installed{waited})")
    if result.returncode:
        said = result.stderr.strip() or f"exit status {result.returncode}"
        return Submitted("", f"sbatch failed: {said}", result.stderr, result.returncode)
    return Submitted(result.stdout.strip().split(";")[0], "", result.stderr, 0)


def requeue(job: str) -> str:
    """Puts `job` back in the queue (`scontrol requeue`); "" where SLURM did, else why not."""
    return failure(["scontrol", "requeue", job])

"""SLURM's client commands (squeue, scontrol, scancel) as the runtime runs them: each with a
deadline, and a command that cannot run or fails told as one sentence. No TensorFlow here."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from tfconfig_slurm.process import timing


def run(
    command: Sequence[str],
    seconds: float = timing.SLURM_COMMAND_SECONDS,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str] | None:
    """Runs the command (in `environ`, else this process's environment), its output
    captured; None where it cannot be run (not installed, or no answer within `seconds`)."""
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

"""A batch job refused at its start, kept for `tfconfig-slurm runs` in the run directory it was
to train; only inside SLURM (a terminal shows it) and where that exists (bad input makes none).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import TfconfigSlurmError
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.run_dir import RunDir


class Refusal(NamedTuple):
    """A job refused at its start: SLURM's name of it (41, or 41_3 in an array), when, why."""

    job_id: str
    time: float
    line: str


@contextlib.contextmanager
def recording(directory: Path, job: SlurmJob | None) -> Iterator[None]:
    """Within the block (a task's start checks), our refusal of its input is recorded in
    `directory` for the SLURM job `job`, and passed on."""
    try:
        yield
    except TfconfigSlurmError as error:
        if job is not None and directory.is_dir() and not _started(directory, job):
            with contextlib.suppress(OSError):
                reports.write_json_atomically(
                    RunDir(directory).refusal,
                    Refusal(job.name, time.time(), error.one_line())._asdict(),
                )
        raise


def _started(directory: Path, job: SlurmJob) -> bool:
    """Whether this attempt of the job `job` started the run in `directory`: then what ended it
    is a failure of its run (failure.py), not a refusal."""
    last = reports.last_attempt(reports.read_state(directory))
    return bool(last.get("job_id") == job.name and last.get("restart", 0) == job.restart_count)


def read(directory: Path) -> Refusal | None:
    """The latest job refused at its start in `directory`, if one was and it can be read."""
    state = reports.read_json(RunDir(directory).refusal)
    try:
        return Refusal(str(state["job_id"]), float(state["time"]), str(state["line"]))
    except (KeyError, TypeError, ValueError):
        return None

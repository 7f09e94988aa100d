"""A batch job refused at its start, kept in the run directory it was to train: refused.json
(the job, when, and the one line it was refused with), which `tfconfig-slurm runs` shows until
a later attempt of the run starts. Only the .out of such a job said why before, and a job that
trained nothing left no run of its own for the table to list.

Written only inside a SLURM job, and only into a directory that exists (its batch script made
its logs there, another run holds it, or a task's failure record made it): at a terminal the
line is said there, and bad input makes no directory. A refusal before the model directory is
known (a flag) stays in the .out.
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
    `directory` where this process is one of the SLURM job `job`'s, and passed on."""
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
    """Whether this attempt of the job `job` (a requeued job keeps its id) started the run in
    `directory`: then what ended it is a failure of its run (failure.py), not a refusal at
    its start."""
    last = reports.last_attempt(reports.read_state(directory))
    return bool(last.get("job_id") == job.name and last.get("restart", 0) == job.restart_count)


def read(directory: Path) -> Refusal | None:
    """The latest job refused at its start in `directory`, if one was and it can be read."""
    state = reports.read_json(RunDir(directory).refusal)
    try:
        return Refusal(str(state["job_id"]), float(state["time"]), str(state["line"]))
    except (KeyError, TypeError, ValueError):
        return None

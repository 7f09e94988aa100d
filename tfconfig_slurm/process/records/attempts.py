"""How often a run started again, for the limits counted over the whole run: state.json's
"restarts" (in its job, or in a new job for a failed node), and the job's variables for
requeues and continuations on a stop. No TensorFlow here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.run_dir import RunDir


def continued_for_nodes(model_dir: Path) -> int:
    """How often the run went on in a new job for a failed node (--max_restarts bounds it)."""
    return sum("continued_in" in each for each in reports.read_state(model_dir).get("restarts", ()))


def requeued(job: SlurmJob) -> int:
    """How often the run was requeued, or went on in a new job on a stop (--max_requeues)."""
    return job.restart_count + job.continuation


def causes_in_job(state: Mapping[str, Any], job: str) -> list[str]:
    """Why the run's step started again in `job`, each time, from its state.json `state`."""
    restarts = state.get("restarts", ())
    return [str(each.get("cause", "")) for each in restarts if each.get("job_id") == job]


def record(model_dir: Path, job: SlurmJob, cause: str, continued_in: str | None = None) -> None:
    """The run's step starts again in `job` for `cause`, or the run goes on in `continued_in`."""
    current = reports.read_state(model_dir)
    restart: dict[str, Any] = {
        "job_id": job.name,
        "restart": job.restart_count,
        "cause": cause,
        "time": time.time(),
    }
    if continued_in is not None:
        restart["continued_in"] = continued_in
    restarts = [*current.get("restarts", []), restart]
    reports.write_json_atomically(RunDir(model_dir).state, {**current, "restarts": restarts})

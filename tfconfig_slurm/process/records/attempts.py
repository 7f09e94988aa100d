"""How often a run started again, for the limits counted over the whole run.

The run keeps one record of its restarts: state.json's "restarts", which every attempt carries,
an entry each time its step started again in its job (the batch script's `tfconfig-slurm
srun`, which counts its own restarts in memory as well), or the run went on in a new job for a
node that failed (`continued_in`). A requeue is SLURM's to count (SLURM_RESTART_COUNT), and a
continuation in a new job, where SLURM refused the requeue, counts on in the next job's
TFCONFIG_SLURM_CONTINUATION: both are read from the job's variables (cluster/step.py). No
TensorFlow here.
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
    """How often the run in `model_dir` went on in a new job for a node that failed (over the
    whole run): what --max_restarts bounds there."""
    return sum("continued_in" in each for each in reports.read_state(model_dir).get("restarts", ()))


def requeued(job: SlurmJob) -> int:
    """How often the run now in `job` had its job requeued, or went on in a new job on a stop
    (over the whole run): what --max_requeues bounds. Read from the job's variables alone."""
    return job.restart_count + job.continuation


def causes_in_job(state: Mapping[str, Any], job: str) -> list[str]:
    """Why the run's step started again in `job`, each time (any attempt of it), from its
    state.json `state`: the runs table's, and a hang's second time."""
    restarts = state.get("restarts", ())
    return [str(each.get("cause", "")) for each in restarts if each.get("job_id") == job]


def record(model_dir: Path, job: SlurmJob, cause: str, continued_in: str | None = None) -> None:
    """The run's step starts again in `job` for `cause`, or, where a node's failure ended
    `job`, the run goes on in the job `continued_in`."""
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

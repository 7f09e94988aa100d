"""A run's attempts, as state.json keeps them the same for every backend: what the task that
owns the run (the chief, or a single process) says of each, and how often the run started again,
for the limits counted over the whole run; and refused.json, a batch job refused at its start
(only inside SLURM, where a terminal does not show it). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import TfconfigSlurmError
from tfconfig_slurm.process.records import failure, reports
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.records.run_dir import RunDir


def owns_run(role: ClusterRole | None) -> bool:
    """Whether this task owns the run: a single process, or the chief of a cluster."""
    return role is None or role.role == CHIEF


@dataclass(frozen=True)
class RunOwner:
    """The owner's view of its run, for state.json and TensorBoard's HParams tab."""

    directory: Path
    experiment: str
    hparams: Mapping[str, Any]
    role: ClusterRole | None
    # The SLURM job (123, or 123_4 for an array task); None outside SLURM.
    job_id: str | None
    # How often SLURM requeued the job before this attempt (a requeued job keeps its id).
    restart: int = 0

    @classmethod
    def in_job(
        cls,
        directory: Path,
        experiment: str,
        hparams: Mapping[str, Any],
        role: ClusterRole | None,
        job: SlurmJob | None,
    ) -> RunOwner:
        """The owner of a run trained in the SLURM `job` (None outside SLURM)."""
        name, restart = (job.name, job.restart_count) if job else (None, 0)
        return cls(directory, experiment, hparams, role, name, restart)

    def first_start(self) -> bool:
        """Whether no attempt of this run has started before (read before saying "running")."""
        return "started" not in reports.read_state(self.directory)

    def last_hparams(self) -> dict[str, Any] | None:
        """The last attempt's hparams, as state.json holds them; None before the first."""
        then: dict[str, Any] | None = reports.read_state(self.directory).get("hparams")
        return then

    def changed_hparams(self) -> dict[str, tuple[Any, Any]]:
        """The hparams that differ from the last attempt's, each as (then, now)."""
        then = self.last_hparams()
        if then is None:
            return {}
        # As state.json holds them: JSON's values.
        now = json.loads(json.dumps(dict(self.hparams)))
        return {
            name: (then.get(name), now.get(name))
            for name in sorted({*then, *now})
            if then.get(name) != now.get(name)
        }

    def say(self, state: RunState, global_step: int | None, **fields: Any) -> None:
        """Records what the run is doing in state.json; earlier fields are kept."""
        current, run = reports.read_state(self.directory), RunDir(self.directory)
        if state == RunState.RUNNING:
            if not current and run.state.exists():
                # Written over, it would be lost: the user may mend it by hand.
                run.state.replace(run.unreadable_state)
                logging.warning(
                    "%s cannot be read (cut short or garbled): set aside as %s; the run's "
                    "record starts again, without its earlier attempts and restarts",
                    run.state,
                    run.unreadable_state,
                )
            # A new attempt: what an earlier one said of its end no longer holds; what each
            # attempt trained with, and from which step, is kept (history.py).
            attempt = {
                "hparams": dict(self.hparams),
                "job_id": self.job_id,
                "restart": self.restart,
                "from_step": global_step,
            }
            current = {
                "started": current.get("started", time.time()),
                "attempts": [*current.get("attempts", []), {**attempt, "started": time.time()}],
                **({"restarts": current["restarts"]} if current.get("restarts") else {}),
            }
        said = {
            "experiment": self.experiment,
            "hparams": dict(self.hparams),
            "job_id": self.job_id,
            "run": self.role.run_id if self.role else None,
            "global_step": global_step,
            **fields,
        }
        reports.write_json_atomically(
            run.state,
            {**current, **said, "state": state, "updated": time.time()},
        )

    @contextlib.contextmanager
    def failing_on_error(self, global_step: Callable[[], int | None]) -> Iterator[None]:
        """Says "failed", at `global_step()`, with the error, if the block raises."""
        try:
            yield
        except BaseException as error:
            self.say(RunState.FAILED, global_step(), error=failure.describe(error))
            raise

    def hparams_for_tensorboard(self) -> dict[str, bool | int | float | str]:
        """The hparams as TensorBoard's HParams tab takes them: other values as text."""
        return {
            name: value if isinstance(value, (bool, int, float, str)) else str(value)
            for name, value in self.hparams.items()
        }


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


class Refusal(NamedTuple):
    """A job refused at its start: SLURM's name of it (41, or 41_3 in an array), when, why."""

    job_id: str
    time: float
    line: str


@contextlib.contextmanager
def recording_refusal(directory: Path, job: SlurmJob | None) -> Iterator[None]:
    """Within the block (a task's start checks), our refusal of its input is recorded in
    `directory` for the SLURM job `job`, and passed on; only where that exists (bad input makes
    none) and this attempt did not start the run (then what ended it is a failure, failure.py)."""
    try:
        yield
    except TfconfigSlurmError as error:
        last = reports.last_attempt(reports.read_state(directory))
        attempt = (last.get("job_id"), last.get("restart", 0))
        if job is not None and directory.is_dir() and attempt != (job.name, job.restart_count):
            with contextlib.suppress(OSError):
                reports.write_json_atomically(
                    RunDir(directory).refusal,
                    Refusal(job.name, time.time(), error.one_line())._asdict(),
                )
        raise


def read_refusal(directory: Path) -> Refusal | None:
    """The latest job refused at its start in `directory`, if one was and it can be read."""
    state = reports.read_json(RunDir(directory).refusal)
    try:
        return Refusal(str(state["job_id"]), float(state["time"]), str(state["line"]))
    except (KeyError, TypeError, ValueError):
        return None

"""The task that owns a run (the chief, or a single process) and what it says of the run in
state.json, the same for every backend. No TensorFlow here."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tfconfig_slurm.cluster.layout import CHIEF
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.process.records import failure, reports
from tfconfig_slurm.process.records.reports import RunState


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
        if job is None:
            return cls(directory, experiment, hparams, role, None)
        return cls(directory, experiment, hparams, role, job.name, job.restart_count)

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
        reports.write_state(
            self.directory,
            state,
            experiment=self.experiment,
            hparams=self.hparams,
            role=self.role,
            job_id=self.job_id,
            restart=self.restart,
            global_step=global_step,
            **fields,
        )

    @contextmanager
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

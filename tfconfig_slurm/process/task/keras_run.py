"""What both Keras backends (tf-keras's, backends/keras/; Keras 3's, backends/keras3/) share as
the lifecycle's backend, with no framework: what they are told (the experiment, its settings,
the task) and what they tell the lifecycle from it (the experiment's name, its hparams, the
step training ends at). What follows each of their steps is cadence.StepEnds's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.task.lifecycle import TaskRun
from tfconfig_slurm.process.task.settings import TrainingSettings
from tfconfig_slurm.process.user_code.experiment import KerasExperiment


class KerasRun:
    """A Keras experiment's run as this task trains it."""

    def __init__(
        self, experiment: KerasExperiment, settings: TrainingSettings, task: TaskRun
    ) -> None:
        self._experiment = experiment
        self._settings = settings
        self._task = task
        self._role = task.place.role
        self._stop = task.stop
        self.experiment = experiment.name
        self.train_steps = settings.train_steps
        self.hparams: Mapping[str, Any] = settings.hparams(experiment.hparams)

    def _report_trained(
        self,
        metrics: Mapping[str, Any],
        mean_examples_per_sec: float | None,
        started: float,
        write_eval: Callable[[Path, Mapping[str, Any], int], None],
    ) -> None:
        """This trainer's report of the run trained to its end (reports.report_trained), with
        the backend's writer of the final evaluation's scalars."""
        reports.report_trained(
            self._settings.model_dir,
            name=self._experiment.name,
            role=self._role,
            train_steps=self._settings.train_steps,
            mean_examples_per_sec=mean_examples_per_sec,
            metrics=metrics,
            started=started,
            write_eval=write_eval,
        )

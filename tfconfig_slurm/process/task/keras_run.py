"""What both Keras backends (tf-keras's, backends/keras/; Keras 3's, backends/keras3/) share as
the lifecycle's backend, with no framework: what they are told (the experiment, its settings,
the task) and what they tell the lifecycle from it (the experiment's name, its hparams, the
step training ends at). What follows each of their steps is cadence.StepEnds's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

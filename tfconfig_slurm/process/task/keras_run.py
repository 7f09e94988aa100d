"""What both Keras backends (tf-keras's, backends/keras/; Keras 3's, backends/keras3/) share as
the lifecycle's backend, with no framework: what they are told (the experiment, its settings,
the task) and what they tell the lifecycle from it (the experiment's name, its hparams, the
step training ends at), and what follows each step of their fit (fit_steps.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.task import cadence
from tfconfig_slurm.process.task.fit_steps import FitSteps, Lines, Scalars
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

    def _fit_steps(
        self,
        start_step: int,
        *,
        examples_per_step: int,
        scalars: Scalars | None,
        sum_votes: cadence.SumVotes | None,
        save: Callable[[int], None],
        loss_scale: int = 1,
    ) -> FitSteps:
        """What follows each step of this trainer's fit, from global step `start_step`: its
        lines (`examples_per_step` its own, fit's loss divided by `loss_scale`) and their
        `scalars`; the trainers' votes summed by `sum_votes` (None: one process), checkpoints
        written by `save`."""
        settings, requeue_on = self._settings, self._task.stop_policy.requeue_on
        return FitSteps(
            start_step=start_step,
            settings=settings,
            lines=Lines(
                start_step, settings.log_every_steps, examples_per_step, scalars, loss_scale
            ),
            ends=cadence.StepEnds(settings, self._stop, requeue_on, sum_votes),
            save=save,
        )

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

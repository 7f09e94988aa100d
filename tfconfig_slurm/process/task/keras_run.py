"""What both Keras backends share as the lifecycle's backend, with no framework: what they are
told and tell the lifecycle, each step of their fit (fit_steps.py), and what follows it (FitRun)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.records import history, reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import cadence, hang_watch
from tfconfig_slurm.process.task.fit_steps import FitSteps, Lines, Scalars
from tfconfig_slurm.process.task.lifecycle import Ending, TaskRun
from tfconfig_slurm.process.task.settings import TrainingSettings
from tfconfig_slurm.process.user_code.experiment import KerasExperiment


def watched_peers(role: ClusterRole | None) -> watchdog.PeerWatch | None:
    """A trainer's watch of its neighbours, which names the lost one among the other trainers
    of its collectives where one fails; None for a single process."""
    if role is None:
        return None
    return watchdog.PeerWatch(watch_plan.neighbours(role), others=watch_plan.other_trainers(role))


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
        """What follows each step of this trainer's fit from global step `start_step`; the
        trainers' votes summed by `sum_votes` (None: one process)."""
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


class FitRun(KerasRun, abc.ABC):
    """A Keras run this task trains with fit (tf-keras's all-reduce, Keras 3's): what follows its
    fit, with what differs behind four methods."""

    def _fit_ended(
        self,
        progress: FitSteps,
        began: tuple[float, int],
        end: Callable[[Ending], Any],
        write_eval: Callable[[Path, Mapping[str, Any], int], None],
    ) -> Any:
        """Evaluates, exports and reports the run trained to --train_steps, or its stop, and
        ends it; `began`: when and at which step this process began."""
        (started, resumed_at), settings = began, self._settings
        hang_watch.paused()
        stopped_on = progress.stopped_early()
        metrics = None
        if stopped_on is None:
            # Decided before the evaluation, whose collectives no trainer passes before every
            # one has: so none has begun an export that another would find.
            name = self._experiment.name
            due = history.export_due(settings.model_dir, name, trained=progress.step > resumed_at)
            metrics = self._evaluated(progress.step)
            if metrics is None:
                stopped_on = self._stop.signal_name
            elif due:
                self._export()
        # Before the reports: a trainer that has reported leaves, and is not lost.
        self._stop_watching()
        if metrics is not None:
            reports.report_trained(
                settings.model_dir,
                name=self._experiment.name,
                role=self._role,
                train_steps=settings.train_steps,
                mean_examples_per_sec=progress.lines.mean_examples_per_sec(),
                metrics=metrics,
                started=started,
                write_eval=write_eval,
            )
        self._end_together()
        return end(Ending(stopped_on))

    @abc.abstractmethod
    def _evaluated(self, step: int) -> Mapping[str, Any] | None:
        """The final checkpoint, of `step`, saved, and the model's metrics on the whole eval
        set, with the step; None where this task was told to stop meanwhile."""

    @abc.abstractmethod
    def _export(self) -> None:
        """The trained model exported (history.export_due said it is due)."""

    @abc.abstractmethod
    def _stop_watching(self) -> None:
        """Stops watching the other trainers, which may now end."""

    @abc.abstractmethod
    def _end_together(self) -> None:
        """Waits here as long as the framework needs the other trainers to end first."""

"""What both Keras backends share as the lifecycle's backend, with no framework: what they are
told and tell the lifecycle; when a run checkpoints and its trainers agree on a stop (StepEnds:
one decision, each backend supplying only how its trainers sum their votes); what follows each
step of their fit (FitSteps: the global step counted, the progress lines, the checkpoint and
the stop; a backend hands in its framework's Callback class, its saver and where its scalars
go); what follows the fit (FitRun); and batches read ahead of the step that trains on them, on
a thread of their own (LookAhead: Keras 3's, which says how a batch is placed)."""

from __future__ import annotations

import abc
import concurrent.futures
import queue
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, NamedTuple

from absl import logging

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import history, reports
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch
from tfconfig_slurm.process.task.lifecycle import Ending, TaskRun, TrainingSettings
from tfconfig_slurm.process.task.throughput import LossSinceLastLine, Rates, Throughput
from tfconfig_slurm.process.user_code.experiment import KerasExperiment

# Without --save_checkpoints_steps or --save_checkpoints_secs: a restart loses at most this much
# (600 s is Estimator's own default).
DEFAULT_CHECKPOINT_STEPS = 1000
DEFAULT_CHECKPOINT_SECONDS = 600.0
# The trainers agree on a stop this often, not every step: each agreement is a collective.
STOP_CHECK_STEPS = 10


def passed(before: int, after: int, every: int) -> bool:
    """Whether global step `before` -> `after` passed a multiple of `every` (fit may run several
    steps a callback, skipping the multiple itself)."""
    return after // every > before // every


class CheckpointCadence:
    """A checkpoint at a multiple of `steps` or `seconds` after the last, whichever comes first
    (None: never by that); the flag given alone, else both defaults."""

    def __init__(self, steps: int | None, seconds: float | None) -> None:
        if steps is None and seconds is None:
            steps, seconds = DEFAULT_CHECKPOINT_STEPS, DEFAULT_CHECKPOINT_SECONDS
        self._steps, self._seconds = steps, seconds
        self._last = time.monotonic()

    def by_steps(self, before: int, after: int) -> bool:
        """Whether global step `before` -> `after` passed a checkpoint's step."""
        return self._steps is not None and passed(before, after, self._steps)

    def by_time(self) -> bool:
        """Whether this process's clock says a checkpoint is due."""
        return self._seconds is not None and time.monotonic() - self._last >= self._seconds

    def saved(self) -> None:
        """A checkpoint was written: the time counts from now."""
        self._last = time.monotonic()


# The trainers' votes summed, in order (an all-reduce, a gather): a collective.
SumVotes = Callable[[Sequence[int]], Sequence[float]]


class StepEnd(NamedTuple):
    """Once a step ended: whether to checkpoint it, and the signal to stop on ("" to go on)."""

    save: bool
    stop_on: str


class StepEnds:
    """What follows each step of a Keras trainer: the hang watch told (resting during a
    checkpoint: a slow write is no hang), a checkpoint where due, a stop on a signal. With
    `sum_votes`, the trainers agree every STOP_CHECK_STEPS steps, so that all stop or save at
    the same step (a checkpoint is a collective); a requeueing signal or a due checkpoint any
    of them has stands for all, so that the chief requeues even where only another was told."""

    def __init__(
        self,
        settings: TrainingSettings,
        stop: preemption.StopRequest,
        requeue_on: Collection[str],
        sum_votes: SumVotes | None,
    ) -> None:
        self._cadence = CheckpointCadence(
            settings.save_checkpoints_steps, settings.save_checkpoints_secs
        )
        self._stop = stop
        self._requeue_on = requeue_on
        self._sum_votes = sum_votes
        self._step = 0

    def after(self, before: int, step: int) -> StepEnd:
        """What follows the step that took the global step from `before` to `step`."""
        hang_watch.stepped(step)
        self._step = step
        stop_on, due = self._agreed(before, step)
        if stop_on:
            logging.info("stopping on %s at global step %d", stop_on, step)
        save = bool(stop_on) or due or self._cadence.by_steps(before, step)
        if save:
            hang_watch.paused()
        return StepEnd(save, stop_on)

    def saved(self) -> None:
        """The trainer wrote the checkpoint `after` asked for."""
        self._cadence.saved()
        hang_watch.stepped(self._step)

    def _agreed(self, before: int, step: int) -> tuple[str, bool]:
        own = self._stop.signal_name if self._stop.requested else ""
        if self._sum_votes is None:
            return own, self._cadence.by_time()
        if not passed(before, step, STOP_CHECK_STEPS):
            return "", False
        votes = self._sum_votes(
            [int(bool(own)), int(own in self._requeue_on), int(self._cadence.by_time())]
        )
        due = bool(votes[2])
        if not votes[0]:
            return "", due
        if votes[1] and own not in self._requeue_on:
            return min(self._requeue_on), due
        return own or preemption.PEERS_SIGNAL, due


# Where a line's scalars go (the chief's TensorBoard run): scalars(values, global step).
Scalars = Callable[[Mapping[str, float], int], None]


class Lines:
    """A fit's progress lines and TensorBoard points, made on a thread of their own: the loss is
    read from the devices there, at a line's step only (a read each step would have the host
    wait for every step before dispatching the next), and the rate is timed by that read, as the
    training thread runs ahead. fit's loss is divided by `loss_scale` (tf-keras sums replicas')."""

    def __init__(
        self,
        start_step: int,
        every: int,
        examples_per_step: int,
        scalars: Scalars | None,
        loss_scale: int = 1,
    ) -> None:
        self._every = every
        self._examples_per_step = examples_per_step
        self._scalars = scalars
        self._loss_scale = loss_scale
        self.meter = Throughput(every)
        self._loss = LossSinceLastLine()
        self._counted: int | None = None
        self._start = start_step
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="progress")
        self._pending: list[concurrent.futures.Future[None]] = []

    def step(self, before: int, step: int, batches: int, logs: Mapping[str, Any] | None) -> None:
        """A step ended at global `step` (fit's `batches` so far); reads nothing."""
        if self._counted is None or passed(before, step, self._every):
            self._hand_over(step, batches, (logs or {}).get("loss"))

    def end(self, step: int) -> Rates | None:
        """Marks the last step, waits for every line before it, and logs the mean."""
        if self._counted is not None and step > self._counted:
            self._hand_over(step, 0, None)
        self.close()
        return self.meter.end()

    def close(self) -> None:
        """Waits for the lines handed over; raises the first one's error."""
        self._thread.shutdown(wait=True)
        for pending in self._pending:
            pending.result()
        self._pending = []

    def _hand_over(self, step: int, batches: int, loss: Any) -> None:
        steps = step - (self._start if self._counted is None else self._counted)
        self._counted = step
        for done in [each for each in self._pending if each.done()]:
            done.result()
            self._pending.remove(done)
        self._pending.append(self._thread.submit(self._say, step, steps, batches, loss))

    def _say(self, step: int, steps: int, batches: int, loss: Any) -> None:
        running = None if loss is None else float(loss) / self._loss_scale
        said = None if running is None else self._loss.mean(step, running, batches)
        rates = self.meter.step(step, steps * self._examples_per_step, said, steps=steps)
        if rates is None or said is None:
            return
        self._loss.said()
        if self._scalars is not None:
            scalars = {"loss": said, "global_steps_per_sec": rates.global_steps_per_sec}
            if rates.examples_per_sec is not None:
                scalars["examples_per_sec"] = rates.examples_per_sec
            self._scalars(scalars, step)


class FitSteps:
    """Counts the global step, hands lines over, checkpoints with `save` and stops on an agreed
    signal, on the training thread, reading the devices only where it must (votes, weights)."""

    def __init__(
        self,
        *,
        start_step: int,
        settings: TrainingSettings,
        lines: Lines,
        ends: StepEnds,
        save: Callable[[int], None],
    ) -> None:
        self._start = start_step
        self._last = settings.train_steps
        self._ends = ends
        self._save = save
        self.step = start_step
        self.stopped_on: str | None = None
        self.lines = lines

    def batch_end(self, batch: int, logs: Mapping[str, Any] | None) -> bool:
        """fit's `batch` of its one epoch ended: whether training stops there."""
        # Also where fit runs several steps a call (Keras 3's --steps_per_execution): its last
        # call runs the steps left to --train_steps, where the batches end.
        before, self.step = self.step, min(self._start + batch + 1, self._last)
        self.lines.step(before, self.step, self.step - self._start, logs)
        end = self._ends.after(before, self.step)
        if end.save:
            self._save(self.step)
            self._ends.saved()
        self.stopped_on = end.stop_on or self.stopped_on
        return bool(end.stop_on)

    def stopped_early(self) -> str | None:
        """The signal training stopped on before --train_steps (None: it reached them; a stop
        agreed on at the last step is no stop)."""
        return self.stopped_on if self.step < self._last else None


def callback(base: type[Any], steps: FitSteps) -> Any:
    """`steps` as fit's callback, an instance of the framework's Callback class `base`."""

    class Progress(base):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            # tf-keras then hands the batch's logs over as tensors, unread (Lines reads them).
            self._supports_tf_logs = True

        def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
            if steps.batch_end(batch, logs):
                self.model.stop_training = True

        def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
            steps.lines.end(steps.step)

    return Progress()


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
        self.hparams: Mapping[str, Any] = {
            name: settings.params[name] for name in experiment.hparams
        }

    def _fit_steps(
        self,
        start_step: int,
        *,
        examples_per_step: int,
        scalars: Scalars | None,
        sum_votes: SumVotes | None,
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
            ends=StepEnds(settings, self._stop, requeue_on, sum_votes),
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
                mean_examples_per_sec=progress.lines.meter.mean_examples_per_sec(),
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


# Enough for the next step's while one runs, in little memory.
AHEAD = 2
_END = object()
# close()'s wait for the reading thread: a generator that blocks for ever is the hang watch's.
_CLOSE_SECONDS = 10.0


class LookAhead:
    """At most `steps` of `batches`, each `placed`, read ahead; `batches()` gives them in order
    (a generator, as Keras's adapters take)."""

    def __init__(self, batches: Iterator[Any], steps: int, placed: Callable[[Any], Any]) -> None:
        self._ahead: queue.Queue[Any] = queue.Queue(AHEAD)
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(batches, steps, placed), name="batches ahead", daemon=True
        )
        self._thread.start()

    def batches(self) -> Iterator[Any]:
        """The batches in order; an error the experiment's generator raised, raised here."""
        while True:
            batch = self._ahead.get()
            if batch is _END:
                return
            if isinstance(batch, BaseException):
                raise batch
            yield batch

    def close(self) -> None:
        """Ends the reading thread (a fit that stopped early leaves it waiting for room) and waits
        a while: the evaluation's batches come next, from generators that may share state."""
        self._closed.set()
        self._drain()
        self._thread.join(timeout=_CLOSE_SECONDS)
        self._drain()

    def _drain(self) -> None:
        while not self._ahead.empty():
            self._ahead.get_nowait()

    def _read(self, batches: Iterator[Any], steps: int, placed: Callable[[Any], Any]) -> None:
        try:
            for _, batch in zip(range(steps), batches):
                if not self._put(placed(batch)):
                    return
            self._put(_END)
        except BaseException as error:
            # Raised again on the training thread, as fit reads the batch it stands for.
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not self._closed.is_set():
            try:
                self._ahead.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

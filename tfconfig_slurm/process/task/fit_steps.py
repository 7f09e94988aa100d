"""What follows each step of a Keras fit, in both Keras backends, with no framework: the global
step counted, the progress lines, and cadence.StepEnds's checkpoint and stop. A backend hands in
its framework's Callback class, its saver and where its scalars go."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Any, Callable

from tfconfig_slurm.process.task import cadence
from tfconfig_slurm.process.task.settings import TrainingSettings
from tfconfig_slurm.process.task.throughput import LossSinceLastLine, Rates, Throughput

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
        self._meter = Throughput(every)
        self._loss = LossSinceLastLine()
        self._counted: int | None = None
        self._start = start_step
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="progress")
        self._pending: list[concurrent.futures.Future[None]] = []

    def step(self, before: int, step: int, batches: int, logs: Mapping[str, Any] | None) -> None:
        """A step ended at global `step` (fit's `batches` so far); reads nothing."""
        if self._counted is None or cadence.passed(before, step, self._every):
            self._hand_over(step, batches, (logs or {}).get("loss"))

    def end(self, step: int) -> Rates | None:
        """Marks the last step, waits for every line before it, and logs the mean."""
        if self._counted is not None and step > self._counted:
            self._hand_over(step, 0, None)
        self.close()
        return self._meter.end()

    def close(self) -> None:
        """Waits for the lines handed over; raises the first one's error."""
        self._thread.shutdown(wait=True)
        for pending in self._pending:
            pending.result()
        self._pending = []

    def mean_examples_per_sec(self) -> float | None:
        return self._meter.mean_examples_per_sec()

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
        rates = self._meter.step(step, steps * self._examples_per_step, said, steps=steps)
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
        ends: cadence.StepEnds,
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
        if end.stop_on:
            self.stopped_on = end.stop_on
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

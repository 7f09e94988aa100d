"""A backend for the tests of the process machinery: it trains no model and imports no
TensorFlow, so a task starts in a fraction of a second where TensorFlow's import took 4-6 s.

Named in TFCONFIG_SLURM_TEST_BACKEND (`tests.fake_backend:backend`, FACTORY below), the runtime
trains an Estimator-kind experiment (tests/fixtures/paced.py) with it instead of Estimator,
through the same Backend protocol (tfconfig_slurm/process/task/lifecycle.py). Everything
around the steps is the runtime's own: the place, the lifecycle, the claim and the records,
the watchdog, stops, requeues and restarts. What only Estimator can fail (its checkpoints, its
ps barrier, its sessions) keeps its tests with real TensorFlow.

- A step is a pause of PACE_SECONDS (paced.py's); the global step is a counter in the model
  directory (COUNTER), which the chief sets from the checkpoint at its start and every trainer
  counts on under a lock, as Estimator's trainers share the one on the parameter servers; a
  trainer takes a step only while its parameter servers answer, as Estimator's blocks on a
  dead one.
- A checkpoint is Estimator's `checkpoint` index with an empty model.ckpt-N.index beside it,
  written by the chief (or a single process) every --save_checkpoints_steps and at its end.
- Told to stop, the chief closes the counter with the signal's name, at a step that is then
  checkpointed, and a trainer stops at its next step when it is told or finds it closed; the
  trainers that take no signal stop on the chief's.
- A trainer answers on its port while it trains, and then says FINISHED along the tree of
  trainers, as with-tfconfig's supervisor does for a script (supervise.say_finished); a
  parameter server answers until its herald says FINISHED (the chief for ps 0, ps 0 for the
  others). Watches of each other's ports are the runtime's (watchdog.PeerWatch).
- FAIL_AS (`worker 0`, or `worker 0@5`: at step 5) makes that task raise once it trains;
  REFUSE_AS (`worker 0`) makes it refuse its input at its start, as where its node lacks the
  data.
- HOLD (`60:/path/release`) holds the trainers at step 60 until the file is there: a test
  kills a task or cuts a node off while the run cannot finish, then lets its restart train on.
- HANG_AS (`worker 0@30`, `single@30` for a single process; `...:/path/once` only until that
  file is there, which it makes) blocks that task for ever as it would take that step, as a
  trainer whose data stalls: its steps are said to the runtime's hang watch, as a real
  backend's are.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

from absl import logging

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF, PS, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.commands import runtime_backends, runtime_flags
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import history, reports
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import supervise, watchdog
from tfconfig_slurm.process.task import hang_watch, lifecycle, throughput
from tfconfig_slurm.process.user_code import experiment as experiment_lib

FACTORY = "tests.fake_backend:backend"
PACE_SECONDS = 0.05
# The global step the trainers share, beside the checkpoints.
COUNTER = "fake-global-step.json"
FAIL_AS = "TFCONFIG_SLURM_TEST_FAIL_AS"
REFUSE_AS = "TFCONFIG_SLURM_TEST_REFUSE_AS"
HOLD = "TFCONFIG_SLURM_TEST_HOLD"
HANG_AS = "TFCONFIG_SLURM_TEST_HANG_AS"
# What a fake step reports, for the lines and records that carry one.
LOSS = 0.25
ACCURACY = 0.9


def environ(**extra: str) -> dict[str, str]:
    """What a test adds to a task's environment for the fake backend to train: the variable,
    and the repository on the path, wherever the task's working directory is."""
    repository = str(Path(__file__).resolve().parent.parent)
    return {runtime_backends.TEST_BACKEND: FACTORY, "PYTHONPATH": repository, **extra}


def backend(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The fake backend for this task (runtime_backends.for_kind's factory)."""
    spec = runtime_flags.EXPERIMENT.value or ""
    name, _ = experiment_lib.locate(spec)
    literal = experiment_lib.literal_hparams(spec) or {}
    role = task.place.role
    if role is not None and (role.role not in (CHIEF, PS, WORKER) or not role.ps_count):
        raise UsageError(
            runtime_backends.TEST_BACKEND,
            f"names the test suite's backend, which plays no {role.task_id} of this layout",
            "it trains a chief, workers and parameter servers, or a single process",
        )
    if role is not None and os.environ.get(REFUSE_AS) == str(role.task_id):
        raise UsageError(REFUSE_AS, f"names {role.task_id}, which refuses on purpose", "unset it")
    return FakeBackend(task, name, experiment_lib.with_overrides(literal, hparams))


class FakeBackend:
    """This task's role played with a counter for a model (the module's docstring)."""

    def __init__(self, task: lifecycle.TaskRun, name: str, hparams: Mapping[str, Any]) -> None:
        self._task = task
        self._role = task.place.role
        self._dir = task.model_dir
        self.experiment = name
        self.hparams = hparams
        self.train_steps: int = runtime_flags.TRAIN_STEPS.value
        self._every = runtime_flags.SAVE_CHECKPOINTS_STEPS.value or 100
        self._batch = runtime_flags.BATCH_SIZE.value
        self._fail_at = _fail_at(self._role)
        held_at, _, release = os.environ.get(HOLD, "").partition(":")
        self._hold = (int(held_at), Path(release)) if release else None

    def checkpoint_step(self) -> int | None:
        return history.checkpoint_step(self._dir)

    def start_details(self) -> tuple[str, ...]:
        return (f"the test suite's fake backend ({runtime_backends.TEST_BACKEND})",)

    def write_hparams(self, hparams: Mapping[str, Any], trial_id: str) -> None:
        (self._dir / "fake-hparams.json").write_text(json.dumps({"trial": trial_id, **hparams}))

    def train(self, end: Callable[[lifecycle.Ending], Any]) -> Any:
        role = self._role
        if role is not None and role.role == PS:
            _serve(role)
            return end(lifecycle.Ending(self._stopped_on(None)))
        started = time.monotonic()
        with watchdog.answering(role) if role else contextlib.nullcontext():
            return end(self._trained(started))

    def _trained(self, started: float) -> lifecycle.Ending:
        """A trainer's (or a single process's) steps to the last or a stop, its checkpoint and
        reports; a trainer then says it finished, its port still answering."""
        role = self._role
        peers = watchdog.PeerWatch(watch_plan.paired(role)) if role else None
        counter = _Counter(self._dir, role, self.checkpoint_step() or 0)
        meter, closed = self._steps(counter)
        hang_watch.paused()
        meter.end()
        if peers is not None:
            peers.stop()
        stopped_on = self._stopped_on(closed)
        step = counter.step()
        if (role is None or role.role == CHIEF) and step != self.checkpoint_step():
            self._save(step)
        if role is None:
            trainer = {"role": CHIEF, "index": 0, "examples_per_sec": meter.mean_examples_per_sec()}
            if stopped_on is not None:
                return lifecycle.Ending(stopped_on)
            return lifecycle.Ending(None, self._summary(step, started, [trainer], "single process"))
        run = reports.marker(role, self.train_steps)
        reports.write_trainer_report(self._dir, role, run, meter.mean_examples_per_sec())
        result = None
        if role.role == CHIEF and stopped_on is None:
            trainers = reports.trainer_reports(self._dir, role.trainers, run)
            result = self._summary(step, started, trainers, role.jobs())
        supervise.say_finished(role, watchdog.exit_on_lost)
        return lifecycle.Ending(stopped_on, result)

    def _steps(self, counter: _Counter) -> tuple[throughput.Throughput, str | None]:
        """Takes steps until the last, or a stop; the meter, and the signal the counter was
        closed on (None: it was not)."""
        meter = throughput.Throughput(runtime_flags.LOG_EVERY_STEPS.value)
        stop, chief = self._task.stop, self._role is None or self._role.role == CHIEF
        servers = list(watch_plan.paired(self._role).values()) if self._role else []
        saved = counter.step()
        hang_watch.began(saved)
        hang_at = _hang_at(self._role)
        while True:
            if hang_at is not None and counter.step() >= hang_at:
                _hang()
            if stop.requested:
                closed = counter.close(stop.signal_name) if chief else None
                logging.info("stopping on %s at global step %d", stop.signal_name, counter.step())
                return meter, closed
            held = self._hold is not None and not self._hold[1].exists()
            if not all(map(watchdog.answers, servers)):
                time.sleep(PACE_SECONDS)
                continue
            last = min(self.train_steps, self._hold[0]) if self._hold and held else self.train_steps
            step, closed = counter.take(last)
            if closed is not None:
                logging.info("stopping on %s at global step %d", closed, counter.step())
            if closed is None and step is None and held:
                time.sleep(PACE_SECONDS)
                continue
            if closed is not None or step is None:
                return meter, closed
            if self._fail_at is not None and step >= self._fail_at:
                raise RuntimeError("this task breaks on purpose")
            meter.step(step, self._batch, LOSS)
            hang_watch.stepped(step)
            if chief and step // self._every > saved // self._every:
                self._save(step)
                saved = step
            time.sleep(PACE_SECONDS)

    def _stopped_on(self, closed: str | None) -> str | None:
        stop = self._task.stop
        return stop.signal_name if stop.requested else closed

    def _save(self, step: int) -> None:
        """Estimator's index and the files it names, as history reads them."""
        started = time.monotonic()
        name = f"model.ckpt-{step}"
        (self._dir / f"{name}.index").write_bytes(history.TABLE_MAGIC)
        index = f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'
        partial = self._dir / "checkpoint.tmp"
        partial.write_text(index)
        partial.replace(RunDir(self._dir).checkpoint_index)
        self._task.stop.checkpoint_written(step, time.monotonic() - started)

    def _summary(
        self, step: int, started: float, trainers: list[dict[str, Any]], layout: Any
    ) -> tuple[dict[str, Any], list[Any]]:
        metrics = {"loss": LOSS, "accuracy": ACCURACY, "global_step": step}
        reports.write_summary(
            self._dir,
            name=self.experiment,
            metrics=metrics,
            wall_time_s=time.monotonic() - started,
            trainers=trainers,
            layout=layout,
        )
        return metrics, []


class _Counter:
    """The global step: in this process for a single process, else in the model directory,
    the chief's to set at its start and close at its stop."""

    def __init__(self, model_dir: Path, role: ClusterRole | None, resumed: int) -> None:
        self._path = model_dir / COUNTER
        self._run = None if role is None else role.run_id or ""
        self._value = {"run": self._run, "step": resumed, "closed": None}
        if role is None:
            return
        # As Estimator's session does, a trainer takes no step before its parameter servers
        # answer (a stop meanwhile waits too).
        for address in watch_plan.paired(role).values():
            while not watchdog.answers(address):
                time.sleep(PACE_SECONDS)
        if role.role == CHIEF:
            with self._held():
                reports.write_json_atomically(self._path, self._value)
            return
        # A worker waits for the chief's start, as Estimator's wait for its variables.
        while self._read().get("run") != self._run:
            time.sleep(PACE_SECONDS)

    def step(self) -> int:
        with self._held():
            return int(self._read()["step"])

    def take(self, last: int) -> tuple[int | None, str | None]:
        """One step taken, its global step; None where `last` is reached; and the signal the
        counter was closed on, if it was."""
        with self._held():
            value = self._read()
            if value["closed"] is not None:
                return None, value["closed"]
            if value["step"] >= last:
                return None, None
            value["step"] += 1
            self._write(value)
            return int(value["step"]), None

    def close(self, signal_name: str) -> str:
        with self._held():
            value = self._read()
            value["closed"] = signal_name
            self._write(value)
        return signal_name

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        if self._run is None:
            yield
            return
        with open(f"{self._path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read(self) -> dict[str, Any]:
        if self._run is None:
            return self._value
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return dict(json.loads(self._path.read_text()))
        return {}

    def _write(self, value: dict[str, Any]) -> None:
        if self._run is None:
            self._value = value
        else:
            reports.write_json_atomically(self._path, value)


def _serve(role: ClusterRole) -> None:
    """A parameter server: answers on its port until its herald says FINISHED, watched and
    watching as with-tfconfig's supervisor of one (supervise.ServerWatch), then says FINISHED
    there itself (supervise.say_served, in the same block: the port is never free between)."""
    with watchdog.answering(role):
        watch = supervise.ServerWatch.start(role, watchdog.exit_on_lost)
        watch.heard.wait()
        watch.stop()
        supervise.say_served(role)


def _hang_at(role: ClusterRole | None) -> int | None:
    """The step at which HANG_AS makes this task hang; None where it names another, or its
    file says it hung once already."""
    named, _, rest = os.environ.get(HANG_AS, "").partition("@")
    step, _, once = rest.partition(":")
    if named != (str(role.task_id) if role else "single") or (once and Path(once).exists()):
        return None
    return int(step or 0)


def _hang() -> None:
    once = os.environ[HANG_AS].partition(":")[2]
    if once:
        Path(once).touch()
    while True:
        time.sleep(3600)


def _fail_at(role: ClusterRole | None) -> int | None:
    """The step at which FAIL_AS makes this task raise; None where it names another."""
    named, _, step = os.environ.get(FAIL_AS, "").partition("@")
    if not named or role is None or named != str(role.task_id):
        return None
    return int(step or 0)

"""One task's life, the same for every backend and both edges (the CLI and the Python API): the
start checks, the model directory held, the run said "running", the backend's training, then
"done" or "stopped", the requeue and the exit; and how it trains (TrainingSettings, the run's
flags). No TensorFlow here: the backend (`Backend`) is made only once the start checks have
passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple, NoReturn, Protocol, Union

from absl import logging

from tfconfig_slurm.cluster.layout import PS, TRAINERS
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import ExitStatus, TfconfigSlurmError, UsageError
from tfconfig_slurm.process import exits, timing
from tfconfig_slurm.process.job import continuation, preemption, what_follows
from tfconfig_slurm.process.records import claim, failure, history
from tfconfig_slurm.process.records.attempts import RunOwner, owns_run
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch, throughput
from tfconfig_slurm.process.task.place import Place

# How a backend's cluster is laid out: trainers with parameter servers (Estimator), or trainers
# that all-reduce their gradients, a chief and workers only (Keras).
PARAMETER_SERVERS = "parameter servers"
ALL_REDUCE = "all-reduce"
# ParameterServerStrategy's: the coordinator trains, the parameter servers and workers serve.
COORDINATOR = "coordinator"


class BackendKind(NamedTuple):
    """What the lifecycle checks of a backend before it is made: its layout, whose checkpoints
    it resumes."""

    layout: str
    checkpoints: str


ESTIMATOR = BackendKind(PARAMETER_SERVERS, history.ESTIMATOR)
TF_KERAS = BackendKind(ALL_REDUCE, history.TF_KERAS)
TF_KERAS_COORDINATOR = BackendKind(COORDINATOR, history.TF_KERAS)
KERAS_3 = BackendKind(ALL_REDUCE, history.KERAS_3)

Hparam = Union[bool, int, float, str]


class Ending(NamedTuple):
    """How a backend's training of this task ended."""

    # The signal the task stopped on, before the last step; None when it trained to the end.
    stopped_on: str | None
    # What the Python API returns on this task (Estimator: the metrics and export results).
    result: Any = None


class Backend(Protocol):
    """What a backend gives the lifecycle: its training and evaluation, its checkpoint step."""

    # The experiment's name, the run's hparams (state.json, runs table), the last global step.
    experiment: str
    hparams: Mapping[str, Any]
    train_steps: int

    def checkpoint_step(self) -> int | None:
        """The global step of the model directory's latest checkpoint (None: there is none).
        The first call sets training up in this process."""

    def start_details(self) -> tuple[str, ...]:
        """What the task's first line says beyond its place and step (e.g. "2 replicas")."""

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        """The run's hparams where TensorBoard's HParams tab finds them (at its first start)."""

    def train(self, end: Callable[[Ending], Any]) -> Any:
        """Trains and evaluates this task, and returns what `end(ending)` returns; a backend
        may call `end` where its training ends, inside a callback, since `end` may never
        return."""


@dataclass(frozen=True)
class TaskRun:
    """One task of a run, as an edge hands it over: where it runs and how it may stop."""

    place: Place
    model_dir: Path
    # How the edge names the model directory in its messages (a flag, RunConfig's model_dir).
    naming: claim.Naming
    stop: preemption.StopRequest
    stop_policy: preemption.StopPolicy
    environ: Mapping[str, str]
    # The SLURM job the edge read from `environ` at its start (None outside SLURM): nothing
    # below it reads SLURM's variables again.
    job: SlurmJob | None
    # Seconds without a step before a trainer is hung (hang_watch); 0: never.
    hang_seconds: float = hang_watch.DEFAULT_SECONDS


@dataclass(frozen=True)
class TrainingSettings:
    """How to train: the flags of `python -m tfconfig_slurm.run` that are not the layout's, for an
    Estimator experiment and a Keras one alike."""

    model_dir: Path
    train_steps: int
    eval_steps: int | None
    params: Mapping[str, Any]
    save_checkpoints_steps: int | None
    save_checkpoints_secs: int | None
    keep_checkpoint_max: int
    intra_op_threads: int
    inter_op_threads: int
    gpu_memory_growth: bool
    gpu_memory_fraction: float | None
    log_every_steps: int
    sync_replicas: bool
    # Keras 3's steps a call, where the experiment's compile left the default 1; None: as compiled.
    steps_per_execution: int | None = None


def run(task: TaskRun, kind: BackendKind, backend: Callable[[], Backend]) -> Any:
    """Runs this task to its end with the backend `backend()` makes, of `kind`, and returns its
    result (the Python API); a parameter server and a task told to stop end the process instead.
    Bad input raises UsageError before anything is made; a refused port or peer is recorded as
    the run's failure instead."""
    return _run(task, kind, backend, returns=True)


def run_to_exit(task: TaskRun, kind: BackendKind, backend: Callable[[], Backend]) -> NoReturn:
    """As `run`, for the CLI: every task ends the process where its training ends (a Keras
    trainer inside fit's last callback, before fit tears its input down)."""
    _run(task, kind, backend, returns=False)
    # Every end of a task ends the process; _trained refuses a backend that called none.
    raise AssertionError("unreachable")


def _run(task: TaskRun, kind: BackendKind, backend: Callable[[], Backend], *, returns: bool) -> Any:
    role = task.place.role
    _check_layout(kind.layout, task.place)
    loaded = functools.partial(_loaded, task, kind, backend)
    made = not task.model_dir.exists()
    # A refusal as it loads or claims the directory is recorded (once attached, in _loaded) as
    # the run's failure, as a refused port is: its peers then lose it at once, where under srun
    # without --kill-on-bad-exit they would wait for it as for a task still starting. A local
    # cluster's launcher stops the others itself.
    recorded = role is not None and not role.in_local_cluster
    with failure.recording_errors() if recorded else contextlib.nullcontext():
        trainer, held = claim.claimed(task.model_dir, role, task.naming, task.job, loaded)
    if role is not None and role.run_id is not None:
        _in_a_thread("failure-watch", _end_if_failed_while_stopping, task, role.run_id)
    limit = _keep_time_limit(task)
    hang_watch.watch(task.hang_seconds, role, task.model_dir, task.place.node)
    with failure.recording_errors():
        try:
            return _train(task, trainer, held, returns, limit)
        except TfconfigSlurmError:
            # Input the run refused (a model the backend cannot train, a dataset that is
            # none) ends it: the directory is freed for the next, with no lock to take over.
            if held is not None:
                held.release()
            # And not left behind where this task made it and nothing was written there.
            if made:
                with contextlib.suppress(OSError):
                    task.model_dir.rmdir()
            raise


def _in_a_thread(name: str, target: Callable[..., object], *args: object) -> None:
    """`target(*args)` on a daemon thread `name`."""
    threading.Thread(target=target, args=args, name=name, daemon=True).start()


def _loaded(task: TaskRun, kind: BackendKind, backend: Callable[[], Backend]) -> Backend:
    """The backend made, once the task's port and peers and the model directory pass, with its
    failures recorded from here on."""
    role = task.place.role
    failure.attach(task.model_dir, role, task.place.node)
    if role is not None:
        # This task's own port or peers refused are the run's first failure: its peers,
        # whose checks pass, would otherwise record it lost once it has gone.
        with failure.recording_errors():
            watchdog.check_task(role)
    # A refusal from here on is recorded by _run, as the claim's is.
    history.check_resumable(task.model_dir, kind.checkpoints, task.naming)
    trainer = backend()
    history.check_same_experiment(task.model_dir, trainer.experiment, task.naming)
    return trainer


def _keep_time_limit(task: TaskRun) -> preemption.TimeLimit | None:
    """The task that requeues the job stops it before its time limit, and says at start, from a
    thread (slurmctld may be slow), where the job may not requeue itself; the run's owner follows
    the limit too, to say why the run stopped. Not in a local cluster: scancel may reach none of
    its tasks (a batch script's own python), and one task stopping alone would fail the others."""
    policy, role, job = task.stop_policy, task.place.role, task.job
    if job is None or (role is not None and role.in_local_cluster):
        return None
    requeues = _requeues(role)
    limit = None
    if policy.time_limit_signal and policy.time_limit_margin > 0 and (requeues or owns_run(role)):
        limit = preemption.watch(
            job, task.stop, policy.time_limit_signal, policy.time_limit_margin, acts=requeues
        )
    if policy.requeue_on and requeues:
        _in_a_thread("requeue-check", continuation.say_at_start, job, task.environ)
    return limit


def _train(
    task: TaskRun,
    trainer: Backend,
    held: claim.Claim | None,
    returns: bool,
    limit: preemption.TimeLimit | None,
) -> Any:
    role = task.place.role
    step = trainer.checkpoint_step()
    task.place.log_start(task.model_dir, step, *trainer.start_details())
    if step is not None and step >= trainer.train_steps:
        logging.warning(
            "the checkpoint in %s is at global step %d, and training ends at step %d: nothing "
            "to train; the checkpoint is evaluated and reported. HINT: raise %s to train on",
            task.model_dir,
            step,
            trainer.train_steps,
            "the TrainSpec's max_steps" if returns else "--train_steps",
        )
    end = _End(task, trainer, held, None, returns, limit)
    if not owns_run(role):
        return _trained(trainer, end)
    owner = _owner(task, trainer, step)
    first = owner.first_start()
    owner.say(RunState.RUNNING, step)
    throughput.report_progress_to(RunDir(task.model_dir).progress)
    hang_watch.when_hung(
        lambda what: owner.say(RunState.FAILED, trainer.checkpoint_step(), error=what)
    )
    with owner.failing_on_error(trainer.checkpoint_step):
        if first:
            trainer.write_hparams(owner.hparams_for_tensorboard(), task.model_dir.name)
        return _trained(trainer, dataclasses.replace(end, owner=owner))


def _owner(task: TaskRun, trainer: Backend, step: int | None) -> RunOwner:
    """The run's owner, with the hparams its record keeps: the ones given, or where the run is
    trained already, those it was trained with (said where they differ)."""
    owner = RunOwner.in_job(
        task.model_dir, trainer.experiment, trainer.hparams, task.place.role, task.job
    )
    changed = owner.changed_hparams()
    last = owner.last_hparams()
    if changed and last is not None and step is not None and step >= trainer.train_steps:
        # Nothing trains with the new ones: the run's record keeps those it was trained with (a
        # user's script builds its model itself).
        logging.warning(
            "%s is trained already: its record keeps the hparams it was trained with, and "
            "this evaluation's model is built with %s",
            task.model_dir,
            ", ".join(f"{name}={now!r}" for name, (_, now) in changed.items()),
        )
        owner = dataclasses.replace(owner, hparams=last)
    elif changed:
        logging.warning(
            "resuming %s with other hparams than its last attempt (%s); state.json keeps each "
            "attempt's, and the run's summary mixes them",
            task.model_dir,
            ", ".join(f"{name}: {then!r} -> {now!r}" for name, (then, now) in changed.items()),
        )
    return owner


def _trained(trainer: Backend, end: _End) -> Any:
    """What the backend's training returns, once it has ended the task through `end`: one
    that returns without (a bug) would leave its run "running", its directory held, and the
    task's exit 0 saying that all went well."""
    _in_a_thread("stop-watch", _end_a_stop_not_taken, end)
    try:
        result = trainer.train(end)
    finally:
        # A script that goes on after the Python API's error is not hung.
        hang_watch.paused()
    if not end.ended.is_set():
        raise BackendError(
            f"the {type(trainer).__name__} returned from its training without ending it (at "
            f"global step {trainer.checkpoint_step()} of {trainer.train_steps}): the run failed"
        )
    return result


class BackendError(RuntimeError):
    """A backend broke its contract with the lifecycle: a bug of ours, not the user's."""


@dataclass(frozen=True)
class _End:
    """The lifecycle's end of a task, which the backend calls as its training ends."""

    task: TaskRun
    backend: Backend
    held: claim.Claim | None
    owner: RunOwner | None
    # Whether a trainer returns the backend's result, or ends the process.
    returns: bool
    # The job's time limit, where this task follows it.
    limit: preemption.TimeLimit | None = None
    # Set once the backend called it (dataclasses.replace keeps the same one).
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)
    # Held by the one caller that ends the task: the backend, or a stop not taken.
    ending: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __call__(self, ending: Ending) -> Any:
        if not self.ending.acquire(blocking=False):
            # The other caller ends the process, or returns the Python API's result: this
            # caller, the stop watch's daemon thread, waits here until the process ends.
            threading.Event().wait()
        self.ended.set()
        hang_watch.paused()
        role = self.task.place.role
        step = self.backend.checkpoint_step()
        if ending.stopped_on is not None:
            stopped_on = self.task.stop.said(ending.stopped_on)
            if self.owner is not None:
                # The stop before the time limit comes as the preempt signal: said as such.
                due = self.limit is not None and self.limit.due()
                why = {"why": "time limit"} if due else {}
                self.owner.say(RunState.STOPPED, step, signal=stopped_on, **why)
            # The model directory stays held, for the requeued job to resume there.
            status = ExitStatus.DONE
            if _requeues(role):
                status = what_follows.after_stop(
                    self.task.environ,
                    self.task.job,
                    stopped_on,
                    self.task.stop_policy,
                    self.task.model_dir,
                )
            exits.end_now(status, f"stopped on {stopped_on}")
        if self.owner is not None:
            self.owner.say(RunState.DONE, step)
        if role is not None:
            logging.info("%s: done", role.task_id)
        if self.held is not None:
            self.held.release()
        if self.returns and (role is None or role.role != PS):
            return ending.result
        exits.end_now(ExitStatus.DONE, "done")


def _end_a_stop_not_taken(end: _End) -> None:
    """Once told to stop, a trainer without a step for timing.STOP_GRACE_SECONDS cannot stop at
    one (it waits in its data, its I/O or a collective): its stacks go into its log, and the task
    that requeues the job ends it as stopped, so that the job requeues from its latest checkpoint
    before SLURM's KillWait ends it without; another trainer waits for that (ended first, it
    would be a lost peer, and the step restarted instead). A task without steps (a parameter
    server, an evaluator) stops as its trainers do."""
    stop = end.task.stop
    stop.wait()
    asked = time.monotonic()
    while (silent := hang_watch.silent_since(asked)) is not None:
        if end.ended.is_set():
            return
        if silent >= timing.STOP_GRACE_SECONDS:
            break
        time.sleep(timing.HANG_CHECK_SECONDS)
    else:
        return
    role = end.task.place.role
    ends = _requeues(role) or (role is not None and role.ps_count > 0 and not role.coordinator)
    logging.error(
        "told to stop on %s %.0f s ago, and its training has taken no step for %.0f s: it "
        "cannot stop at a step with a checkpoint, and %s, from its latest checkpoint (step "
        "%s); every thread's stack follows",
        stop.signal_name,
        time.monotonic() - asked,
        silent,
        "stops now" if ends else "the task that requeues the job stops it",
        end.backend.checkpoint_step(),
    )
    hang_watch.write_stacks(str(role.task_id) if role else "the process")
    if ends:
        end(Ending(stop.signal_name))


def _end_if_failed_while_stopping(task: TaskRun, run_id: str) -> None:
    """Once told to stop, ends this task as soon as the run has failed: SLURM stops a step so
    (SIGTERM) when a task failed, and the others would otherwise stop gracefully beside it until
    their watchdogs found it lost. A peer's port that refuses at the signal is a dead peer."""
    task.stop.wait()
    watchdog.snap_all()
    while True:
        first = failure.read(task.model_dir, run_id)
        if first is not None:
            failure.say_ending(first.line(), ExitStatus.PEER_LOST, why=", told to stop, at once")
            exits.end_now(ExitStatus.PEER_LOST, f"the run failed: {first.line()}")
        time.sleep(timing.FAILURE_POLL_SECONDS)


def _requeues(role: ClusterRole | None) -> bool:
    """Whether this task requeues the job after a stop: the one that sees every trainer
    finish, the first parameter server where there are some (but for a coordinator, whose
    end ends the others), else the chief."""
    if role is None:
        return True
    if role.ps_count and not role.coordinator:
        return role.role == PS and role.index == 0
    return owns_run(role)


def coordinator_refused(culprit: str) -> UsageError:
    """The error for a coordinator's layout, which only a Keras experiment trains with."""
    return UsageError(
        culprit,
        "lays the step out for ParameterServerStrategy's coordinator, which only a Keras "
        "experiment trains with: an Estimator experiment trains with parameter servers and no "
        "coordinator",
        "leave it out for an Estimator experiment; a ParameterServerStrategy script runs "
        "under with-tfconfig --coordinator",
    )


def _check_layout(layout: str, place: Place) -> None:
    """A cluster the backend cannot train in fails here, before the backend is made."""
    role = place.role
    if role is None:
        return
    if role.coordinator != (layout == COORDINATOR):
        raise coordinator_refused(place.layout_source)
    if layout == PARAMETER_SERVERS and role.ps_count == 0:
        raise UsageError(
            place.layout_source,
            "gives a cluster without parameter servers, which Estimator training needs",
            "a parameter server on each node is the default; drop the setting that removed them",
        )
    if layout == ALL_REDUCE and (role.role not in TRAINERS or role.ps_count):
        # MultiWorkerMirroredStrategy would fail a ps's process at its creation, with a trace.
        raise UsageError(
            place.layout_source,
            f"makes this task {role.task_id} of a cluster with {role.ps_count} parameter "
            "servers, and a Keras experiment trains with a chief and workers only",
            "lay the step out with --all_reduce (with-tfconfig --all_reduce), or unset TF_CONFIG",
        )

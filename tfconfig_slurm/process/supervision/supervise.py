"""with-tfconfig's supervision of its command, a child it passes signals on to and whose exit
status it returns: the guarantees of docs/with-tfconfig.md for a script that knows nothing of
them. A task told to stop gives its command timing.STOP_GRACE_SECONDS to finish its stop before
a quiet peer ends it. The signal handlers, the watches and the main thread share the task's
state (TaskState); no thread waits for another to end the process."""

from __future__ import annotations

import contextlib
import enum
import math
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, NoReturn, cast

from absl import logging

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.layout import CHIEF, PS, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import ExitStatus
from tfconfig_slurm.process import exits, timing
from tfconfig_slurm.process.job.preemption import StopRequest
from tfconfig_slurm.process.records import failure
from tfconfig_slurm.process.records.attempts import RunOwner
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.supervision import children, watchdog
from tfconfig_slurm.process.user_code import versions

FORWARDED = children.STOPPING + children.PASSED_ON
# Restarts of a coordinator's worker's failed command: the coordinator uses it again once back.
WORKER_RESTARTS = 3


class State(enum.Enum):
    """A supervised task's state, only ever moving on: running, stopping (by a signal), then
    done, failed (its command) or lost (a peer)."""

    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    LOST = "lost"


class LostPeer(NamedTuple):
    """The peer whose loss ends the task, as its watch found it."""

    name: str
    address: str
    # 0: it said its command failed.
    silent_for: float


class TaskState:
    """A supervised task's state, from its command's start. The end is taken once: by a watch
    that lost a peer, or by the main thread, whose command failed or which returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Kept apart from the end, as the signal handler notes it without the lock.
        self._stop = StopRequest()
        self._end: State | None = None
        # The peer whose loss ended the task, once a watch has taken its end.
        self.lost: LostPeer | None = None

    @property
    def state(self) -> State:
        return self._end or (State.STOPPING if self._stop.requested else State.RUNNING)

    @property
    def stopped_by(self) -> signal.Signals | None:
        """The first stopping signal the task was sent, if any."""
        return self._stop.signum

    def told_to_stop(self, signum: signal.Signals) -> None:
        """A stopping signal came; the first is the one to say. No lock: called from the signal
        handler, whose interrupted main thread may hold it."""
        self._stop.note(signum.name)

    def take_end(self, state: State, lost: LostPeer | None = None) -> bool:
        """Takes the task's end as `state` (FAILED, or LOST with the peer); True if first."""
        with self._lock:
            if self._end is not None:
                return False
            self._end, self.lost = state, lost
        return True

    def close(self) -> bool:
        """The main thread's last word: from now on a watch takes no end. False where a watch
        lost a peer first, for which the main thread then ends the task."""
        with self._lock:
            if self._end is None:
                self._end = State.DONE
            return self._end is not State.LOST


def command_group(aside: Path | None = None) -> children.Group:
    """The group for the one command: in the supervisor's process group, as srun expects."""
    return children.Group(own_sessions=False, aside=aside)


def supervise(
    command: children.Group,
    role: ClusterRole,
    owner: RunOwner | None = None,
    restarts: int = WORKER_RESTARTS,
    *,
    keras_3: bool = False,
) -> int:
    """Runs the command started in `command` as `role`'s task to its end; the exit status to
    leave with. `owner` (the chief's) records how it ended; a `keras_3` one trains Keras 3."""
    supervisor = _Supervisor(command, role, owner, keras_3)
    supervisor.pass_signals_on()
    return supervisor.closed(supervisor.run(restarts))


class _Supervisor:
    """One task's supervision: its command, role, the run's owner (the chief's) and state."""

    def __init__(
        self, command: children.Group, role: ClusterRole, owner: RunOwner | None, keras_3: bool
    ) -> None:
        self.command, self.role, self.owner, self.keras_3 = command, role, owner, keras_3
        self.state = TaskState()

    def pass_signals_on(self) -> None:
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        if self.owner is not None:
            # Only once signals are passed on: a stop before would leave the run "running".
            # The command is recorded, as the runtime resumes none of a user's scripts.
            (child,) = self.command.started
            self.owner.say(RunState.RUNNING, None, command=cast("list[str]", child.args))

    def run(self, restarts: int) -> int:
        """The command run to its end as the role's task; its exit status."""
        role = self.role
        if role.role == PS or (role.coordinator and role.role == WORKER):
            return self._serve(restarts if role.role == WORKER else 0)
        if role.coordinator and role.role == CHIEF:
            return _coordinate(role, self._run_watched(role.named(PS)))
        if role.role in (CHIEF, WORKER):
            status = self._run_watched(
                watch_plan.paired(role) if role.ps_count else watch_plan.neighbours(role)
            )
            if status == 0:
                say_finished(role, self.lost, self.end_if_lost)
            return status
        (child,) = self.command.started
        status = exits.exit_status(child.wait())
        if status != 0 and self.state.stopped_by is None:
            logging.error("%s: %s", role.task_id, self._its_failure(child))
        return status

    def lost(self, name: str, address: str, silent_for: float) -> None:
        """A watch lost `name`: unless this task's command finishes its stop or fails of its
        own meanwhile, takes the task's end and kills the command (the main thread ends it)."""
        if self.state.stopped_by is not None:
            since = time.monotonic()
            if _stops_meanwhile(self.command, self.role, name):
                return
            silent_for += time.monotonic() - since
        # A peer's command may fail of what fails this one's too: then this task names its own.
        if silent_for == 0 and _fails_itself(self.command):
            return
        if self.state.take_end(State.LOST, LostPeer(name, address, silent_for)):
            self.command.signal(signal.SIGKILL)

    def end_if_lost(self) -> None:
        if self.state.lost is not None:
            self._end_lost(self.state.lost)

    def closed(self, status: int) -> int:
        """`status`, once no watch may take the task's end any more; unless one took it."""
        if not self.state.close():
            self.end_if_lost()
        return status

    def _forward(self, number: int, frame: object) -> None:
        if number in children.STOPPING:
            self.state.told_to_stop(signal.Signals(number))
        self.command.signal(number)

    def _end_lost(self, lost: LostPeer) -> NoReturn:
        """Ends the task for its lost peer, once its command is gone and its last output out."""
        # Killed again: a command started again meanwhile too.
        self.command.signal(signal.SIGKILL)
        for started in self.command.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.wait(timeout=timing.END_GRACE_SECONDS)
            relay = self.command.relay(started)
            if relay is not None:
                relay.finish(1.0)
        first = watchdog.report_lost(lost.name, lost.address, watchdog.silence(lost.silent_for))
        if self.owner is not None:
            self.owner.say(RunState.FAILED, None, lost=lost.name)
        # Not the peer, where the run failed first elsewhere: two survivors lost each other.
        why = f"{lost.name} is lost" if first is None else f"the run failed ({first.task} first)"
        _say_failed(self.role, f"it ends, as {why}")
        exits.end_now(ExitStatus.PEER_LOST, f"{lost.name} is lost")

    def _take_failed_end(self) -> None:
        """Takes the task's end as FAILED, unless a watch lost a peer first: then ends for it."""
        if not self.state.take_end(State.FAILED):
            self.end_if_lost()

    def _why(self, child: children.Child) -> str:
        """The command's last exception line, once its output has ended; "" for a signal."""
        relay = self.command.relay(child)
        if relay is None:
            return ""
        relay.finish()
        return relay.why_it_failed() if child.returncode > 0 else ""

    def _its_failure(self, child: children.Child) -> str:
        """Records the command's failure; says it: `its command failed: ValueError: ...`."""
        why = self._why(child)
        failure.record_exit(child.returncode, why)
        relay = self.command.relay(child)
        if relay is not None and relay.through_keras_3 and not self.keras_3:
            logging.error(
                "%s: its command's traceback runs through Keras 3 (import keras), which "
                "tf.distribute's MultiWorkerMirroredStrategy and ParameterServerStrategy do not "
                "train (keras-team/keras#20585). HINT: build the model with tf-keras: import "
                "tf_keras as keras (pip install tf-keras), or tf.keras with TF_USE_LEGACY_KERAS=1 "
                "set before TensorFlow is imported; or train it on JAX: with-tfconfig --keras3 "
                "(docs/keras3.md)",
                self.role.task_id,
            )
        return f"its command failed: {why}" if why else "its command failed"

    def _run_watched(self, watched: dict[str, str]) -> int:
        """Runs a trainer's or coordinator's command while `watched` are watched; its status."""
        (child,) = self.command.started
        peers = watchdog.PeerWatch(watched, on_lost=self.lost)
        # Not waiting for the killed command itself, which may never end (uninterruptible sleep).
        _wait_for_end(child, math.inf, unless=lambda: self.state.lost is not None)
        peers.stop()
        self.end_if_lost()
        status = exits.exit_status(child.returncode)
        _after_command()
        stopped_by = self.state.stopped_by
        owner = self.owner
        if owner is not None and status == 0:
            owner.say(RunState.DONE, None)
        elif owner is not None and stopped_by is not None:
            owner.say(RunState.STOPPED, None, signal=stopped_by.name)
        elif owner is not None:
            owner.say(RunState.FAILED, None, exit_status=status)
        if status != 0:
            self._take_failed_end()
            if stopped_by is not None:
                _say_failed(self.role, f"its command stopped on {stopped_by.name}")
            else:
                _say_failed(self.role, self._its_failure(child))
        return status

    def _serve(self, restarts: int) -> int:
        """A task that serves (a ps, a coordinator's worker) until its herald says FINISHED, then
        ends its command; a failed one is started again up to `restarts` times."""
        command, role, state = self.command, self.role, self.state
        watch = ServerWatch.start(role, self.lost)
        child, restarted = command.started[-1], 0
        while not watch.heard.wait(0.2) and state.lost is None:
            if child.poll() is None:
                continue
            if child.returncode == 0 or restarted == restarts or state.state is not State.RUNNING:
                break
            restarted += 1
            logging.warning(
                "%s: its command %s; starting it again on its port (restart %d of at most %d)",
                role.task_id,
                exits.how_it_ended(child.returncode),
                restarted,
                restarts,
            )
            child = command.start_again(child)
        watch.stop()
        self.end_if_lost()
        if not watch.heard.is_set():
            return self._server_ended(child)
        logging.info(
            "%s: %s; ending its command (a server's join() never returns; %s said so)",
            role.task_id,
            "the coordinator finished" if role.coordinator else "every trainer finished",
            next(iter(watch_plan.herald(role))),
        )
        command.stop(timing.END_GRACE_SECONDS)
        say_served(role)
        return 0

    def _server_ended(self, child: children.Child) -> int:
        """A serving task's command that ended before its herald said FINISHED: its status."""
        role = self.role
        status = exits.exit_status(child.wait())
        _after_command()
        if status == 0:
            return 0
        # SLURM signals every process of a step it stops: the command may die of it before
        # this supervisor's own copy has come.
        if self.state.stopped_by or -child.returncode in children.STOPPING:
            logging.info("%s: its command %s", role.task_id, exits.how_it_ended(child.returncode))
            return status
        # The wrapper's own status is news only where a signal ended the command.
        how = exits.how_it_ended(child.returncode)
        logging.error(
            "%s: its command %s; its log above may say why.%s",
            role.task_id,
            f"{how} (exit {status})" if child.returncode < 0 else how,
            _server_failure_hint(role, self._why(child)),
        )
        # The end taken before the failure is recorded: a peer lost first stays the first.
        self._take_failed_end()
        _say_failed(role, self._its_failure(child))
        return status


def _stops_meanwhile(command: children.Group, role: ClusterRole, name: str) -> bool:
    """Whether a command told to stop, its peer `name` gone quiet, finishes its stop in time."""
    child = command.started[-1]
    if child.returncode is not None or failure.run_failed():
        return False
    logging.info(
        "%s: %s went quiet while this task stops; its command has %.0f s to finish its stop",
        role.task_id,
        name,
        timing.STOP_GRACE_SECONDS,
    )
    _wait_for_end(child, timing.STOP_GRACE_SECONDS, unless=failure.run_failed)
    return child.returncode is not None


def _fails_itself(command: children.Group) -> bool:
    """Whether this task's command fails too within timing.OWN_FAILURE_SECONDS."""
    child = command.started[-1]
    _wait_for_end(child, timing.OWN_FAILURE_SECONDS)
    return child.returncode not in (None, 0)


def _wait_for_end(
    child: children.Child, seconds: float, unless: Callable[[], bool] = lambda: False
) -> None:
    """Waits at most `seconds` for `child` to end, giving up once `unless` holds. Safe from
    another thread than the main one, which reaps the command: poll() there would say None."""
    deadline = time.monotonic() + seconds
    while child.returncode is None and time.monotonic() < deadline and not unless():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, min(timing.PROBE_SECONDS, deadline - time.monotonic())))


def _after_command() -> None:
    """Nothing left to pass signals on to: the stopping ones end this process."""
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL if signum in children.STOPPING else signal.SIG_IGN)


def _say_failed(role: ClusterRole, why: str) -> None:
    """Answers FAILED on the task's port long enough for every watcher to probe it twice: its
    command may have died before it ever listened."""
    if sum(map(len, role.cluster.values())) == 1 and not role.has_evaluator:
        logging.error("%s %d: %s; exiting", role.role, role.index, why)
        return
    seconds = 2 * watchdog.round_seconds(max(role.ps_count, 1)) + timing.LOST_AFTER_SECONDS
    logging.error(
        "%s %d: %s; saying so on its port for %.0f s, then exiting",
        role.role,
        role.index,
        why,
        seconds,
    )
    with watchdog.answering(role) as answer:
        answer.append(watchdog.FAILED)
        time.sleep(seconds)


def _coordinate(role: ClusterRole, status: int) -> int:
    """A coordinator whose command exited 0 says FINISHED until the parameter servers have gone
    (it watched them only: a lost worker is TensorFlow's to tolerate)."""
    if status != 0:
        return status
    logging.info(
        "chief 0 (the coordinator): its command finished; the parameter servers and the "
        "workers end theirs"
    )
    with watchdog.answering(role) as answer:
        answer.append(watchdog.FINISHED)
        watchdog.until_gone(role.named(PS))
    return 0


class ServerWatch(NamedTuple):
    """A serving task's watches: `near` its herald and paired trainers, `far` the other
    parameter servers; `heard` is set once the herald has said FINISHED."""

    heard: threading.Event
    near: watchdog.PeerWatch
    far: watchdog.PeerWatch

    @classmethod
    def start(cls, role: ClusterRole, lost: watchdog.OnLost) -> ServerWatch:
        herald = watch_plan.herald(role)
        heard = threading.Event()

        def on_finished(name: str) -> None:
            if name in herald:
                heard.set()

        trainers = watch_plan.paired(role) if role.role == PS and not role.coordinator else {}
        near = watchdog.PeerWatch({**trainers, **herald}, on_lost=lost, on_finished=on_finished)
        servers = watch_plan.other_servers(role) if role.role == PS else {}
        mesh = {name: address for name, address in servers.items() if name not in herald}
        return cls(heard, near, watchdog.PeerWatch(mesh, on_lost=lost, on_finished=lambda _: None))

    def stop(self) -> None:
        self.near.stop()
        self.far.stop()


def say_served(role: ClusterRole) -> None:
    """Says FINISHED on the port of a task that has served until those who learn it here have
    gone: for ps 0 the other parameter servers, for a coordinator's ps its paired workers."""
    waiting = watch_plan.other_servers(role) if role.role == PS and role.index == 0 else {}
    if role.coordinator and role.role == PS:
        waiting.update(watch_plan.paired_workers(role))
    with watchdog.answering(role) as answer:
        answer.append(watchdog.FINISHED)
        watchdog.until_gone(waiting)


def _server_failure_hint(role: ClusterRole, failed: str) -> str:
    """What to do about a serving task's command that `failed` (its words), from a space on;
    "" for a worker, and for a failure that says no known cause."""
    if role.role != PS:
        return ""
    if role.coordinator:
        return (
            " The coordinator cannot go on without it: run the step again to resume from the "
            "last checkpoint"
        )
    return f" {hint}" if (hint := _ps_failure_hint(versions.installed(), failed)) else ""


def _ps_failure_hint(found: versions.Installed, failed: str) -> str:
    """The cause a parameter server's command that `failed` names, given the TensorFlow
    installed: MultiWorkerMirroredStrategy's, which has no parameter servers, or an Estimator
    script's on a TensorFlow without Estimator."""
    tensorflow = found.tensorflow
    if tensorflow and not versions.has_estimator_release(tensorflow) and "estimator" in failed:
        return (
            f"With TensorFlow {tensorflow} here, an Estimator script cannot run: Estimator "
            "needs TensorFlow 2.15"
        )
    if "task_type 'ps'" in failed or "MultiWorkerMirroredStrategy" in failed:
        return (
            "A script that trains with MultiWorkerMirroredStrategy fails beside a parameter "
            "server: run it under with-tfconfig --all_reduce"
        )
    return ""


def say_finished(
    role: ClusterRole, lost: watchdog.OnLost, each_probe: Callable[[], None] = lambda: None
) -> None:
    """A trainer whose command exited 0 answers WAITING until its children in the tree say
    FINISHED, then FINISHED until its parameter servers have gone and its parent has seen it."""
    with watchdog.answering(role) as answer:
        children = watch_plan.children(role)
        if children:
            waiting = set(children)
            done = threading.Event()

            def on_finished(name: str) -> None:
                waiting.discard(name)
                if not waiting:
                    done.set()

            watch = watchdog.PeerWatch(children, on_lost=lost, on_finished=on_finished)
            while not done.wait(timing.PROBE_SECONDS):
                each_probe()
            watch.stop()
        logging.info(
            "%s %d: its command and the %d trainers below it finished",
            role.role,
            role.index,
            watch_plan.trainers_below(role),
        )
        # A peer lost as the command ended, found now: FAILED, not FINISHED.
        each_probe()
        answer.append(watchdog.FINISHED)
        # A command that finished at once (nothing left to train) may finish before its
        # parameter servers have probed this port: they would take it for lost.
        watchdog.until_gone(watch_plan.paired(role), unseen_for=timing.UNSEEN_SECONDS)
        parent = watch_plan.parent(role)
        if parent is not None:
            _until_finished_or_gone(parent)


def _until_finished_or_gone(address: str) -> None:
    """Returns once the task at `address` says FINISHED, or is lost (its watchers end it)."""
    silent_since = None
    while not (finished := watchdog.says_finished(address)):
        now = time.monotonic()
        if finished is None:
            silent_since = silent_since or now
            if now - silent_since >= timing.LOST_AFTER_SECONDS:
                return
        else:
            silent_since = None
        time.sleep(timing.PROBE_SECONDS)

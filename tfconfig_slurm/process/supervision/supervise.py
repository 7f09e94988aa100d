"""with-tfconfig's supervision of its command: the runtime's guarantees for a script that knows
nothing of them.

The command runs as a child, with its task's environment. Signals sent to the supervisor are
passed on to it, and its exit status comes back out (128 + N for a child a signal ended). The
child dies with the supervisor (children.py), so no task outlives its srun. Around it, by role:

- Who watches whom is cluster/watch_plan.py's: a trainer its paired parameter servers, a
  parameter server its paired trainers and the other parameter servers; without parameter
  servers (all-reduce training), a trainer its neighbours in the tree of trainers. A watched
  task that stops answering ends the watcher, by name, with exit status 3 (watchdog.py);
  but a task told to stop (scancel signals every task of the step) first gives its command
  timing.STOP_GRACE_SECONDS to finish its own stop, unless the run has recorded a failure.
- When a trainer's command exits 0, the trainer answers on its own port, free again: alive
  (WAITING) until the trainers below it in the tree of trainers have finished, then
  FINISHED, until its parameter servers have gone and its parent has seen it.
- A stock Estimator or TF2 parameter server never returns (`server.join()`): ps 0 ends its
  command once the chief says FINISHED (every trainer finished), says FINISHED itself, and
  the other parameter servers end theirs on that; each exits 0.
- A task whose command failed answers FAILED for a while, then leaves with its status: its
  watchers end at once, even if its command died before it ever listened.
- An evaluator is only supervised.

The task's state is explicit (task_state.py): running, stopping, and done, failed or lost. A
watch that loses a peer takes the task's end and kills the command; the main thread, which
looks at the state each probe interval, ends the task; every way out of supervise() closes the
state. No thread waits for another to end the process.

No TensorFlow here: processes, signals and sockets.
"""

from __future__ import annotations

import contextlib
import functools
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
from tfconfig_slurm.process.records import failure
from tfconfig_slurm.process.records.owner import RunOwner
from tfconfig_slurm.process.records.reports import RunState
from tfconfig_slurm.process.supervision import answering, children, watchdog
from tfconfig_slurm.process.supervision.task_state import LostPeer, State, TaskState
from tfconfig_slurm.process.user_code import versions

# The signals a supervisor passes on to its command.
FORWARDED = children.STOPPING + children.PASSED_ON
# How often a ParameterServerStrategy worker's command that failed is started again: the
# coordinator carries on with the others meanwhile, and uses it again once it is back.
WORKER_RESTARTS = 3


def command_group(aside: Path | None = None) -> children.Group:
    """The group for the one command: it shares the supervisor's process group, as srun and a
    shell expect of a task's processes, and its stderr passes through the supervisor, which
    reads why it failed there, and puts a native library's fatal end `aside` where given."""
    return children.Group(own_sessions=False, relay_stderr=True, aside=aside)


def supervise(
    command: children.Group,
    role: ClusterRole,
    owner: RunOwner | None = None,
    restarts: int = WORKER_RESTARTS,
    *,
    keras_3: bool = False,
) -> int:
    """Runs the command started in `command` as `role`'s task to its end; the exit status to
    leave with. The run's `owner` (the chief, told its run directory) says in state.json that
    the command runs, and how it ended: done, stopped on a signal, or failed. A coordinator's
    worker whose command fails starts it again, at most `restarts` times. A `keras_3` command
    trains Keras 3 on JAX: a traceback through Keras 3 is no sign of the wrong Keras there."""
    supervisor = _Supervisor(command, role, owner, keras_3)
    supervisor.pass_signals_on()
    return supervisor.closed(supervisor.run(restarts))


class _Supervisor:
    """One task's supervision: its command, its role, the run's owner where it is the chief,
    and the task's state, which the signal handlers, the watches' threads and the main thread
    share."""

    def __init__(
        self, command: children.Group, role: ClusterRole, owner: RunOwner | None, keras_3: bool
    ) -> None:
        self.command, self.role, self.owner = command, role, owner
        self.state = TaskState()
        self.explained = functools.partial(_its_failure, keras_3=keras_3)
        self.end_lost = functools.partial(_end_lost, command, role, owner)

    def pass_signals_on(self) -> None:
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        if self.owner is not None:
            # Once signals are passed on: a stop before would end this wrapper, its command
            # with it, and leave the run "running". The command said apart from the runtime's
            # experiments: a user's scripts may share a directory (one trains, one evaluates),
            # and the runtime resumes none of theirs.
            # Group.start gives Popen the command as a list.
            (child,) = self.command.started
            self.owner.say(RunState.RUNNING, None, command=cast("list[str]", child.args))

    def run(self, restarts: int) -> int:
        """The command run to its end as the role's task; its exit status."""
        command, role, state = self.command, self.role, self.state
        if role.role == PS or (role.coordinator and role.role == WORKER):
            restarts = restarts if role.role == WORKER else 0
            return _serve(
                command, role, self.lost, state, self.end_lost, restarts=restarts,
                its_failure=self.explained,
            )  # fmt: skip
        ended = functools.partial(
            _run_watched, command, role, lost=self.lost, state=state, end_lost=self.end_lost,
            owner=self.owner, its_failure=self.explained,
        )  # fmt: skip
        if role.coordinator and role.role == CHIEF:
            return _coordinate(role, ended(role.named(PS)))
        if role.role in (CHIEF, WORKER):
            status = ended(
                watch_plan.paired(role) if role.ps_count else watch_plan.neighbours(role)
            )
            if status == 0:
                say_finished(role, self.lost, self.end_if_lost)
            return status
        (child,) = command.started
        status = exits.exit_status(child.wait())
        if status != 0 and state.stopped_by is None:
            logging.error("%s: %s", role.task_id, self.explained(command, child, role))
        return status

    def lost(self, name: str, address: str, silent_for: float) -> None:
        """A watch lost `name`: unless this task finishes its own stop meanwhile, or its
        command fails of its own, the watch takes the task's end and kills the command; the
        main thread, back from it, ends the task (_end_lost)."""
        if self.state.stopped_by is not None:
            since = time.monotonic()
            if _stops_meanwhile(self.command, self.role, name):
                return
            silent_for += time.monotonic() - since
        # A peer that says its command failed may have failed of what fails this task's too
        # (one script, one traceback): then this task names its own failure, not the peer.
        if silent_for == 0 and _fails_itself(self.command):
            return
        if self.state.take_end(State.LOST, LostPeer(name, address, silent_for)):
            self.command.signal(signal.SIGKILL)

    def end_if_lost(self) -> None:
        if self.state.lost is not None:
            self.end_lost(self.state.lost)

    def closed(self, status: int) -> int:
        """`status`, once no watch may take the task's end any more; unless one took it."""
        if not self.state.close():
            self.end_if_lost()
        return status

    def _forward(self, number: int, frame: object) -> None:
        if number in children.STOPPING:
            self.state.told_to_stop(signal.Signals(number))
        self.command.signal(number)


def _end_lost(
    command: children.Group, role: ClusterRole, owner: RunOwner | None, lost: LostPeer
) -> NoReturn:
    """Ends the task whose watch lost a peer: once its command has gone (killed, again: one
    started again meanwhile too), its port free and its last output passed on, says which
    peer, records it as the run's failure (the owner in state.json too), and says FAILED on
    the task's port."""
    command.signal(signal.SIGKILL)
    for started in command.started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.wait(timeout=timing.END_GRACE_SECONDS)
        relay = command.relay(started)
        if relay is not None:
            relay.finish(1.0)
    first = watchdog.report_lost(lost.name, lost.address, watchdog.silence(lost.silent_for))
    if owner is not None:
        owner.say(RunState.FAILED, None, lost=lost.name)
    # Its own watchers may never have heard from it (its command died before listening):
    # they learn it at once, as from a failed command.
    # Not the peer, where the run failed first elsewhere: two survivors lost each other.
    why = f"{lost.name} is lost" if first is None else f"the run failed ({first.task} first)"
    _say_failed(role, f"it ends, as {why}")
    exits.end_now(ExitStatus.PEER_LOST, f"{lost.name} is lost")


def _stops_meanwhile(command: children.Group, role: ClusterRole, name: str) -> bool:
    """For a task told to stop whose peer `name` went quiet: whether its command, still
    running, finishes its stop within timing.STOP_GRACE_SECONDS (its peers stop too: no failure),
    unless the run has recorded a failure meanwhile."""
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
    """Whether this task's command, still running as a peer said its own failed, fails too
    within timing.OWN_FAILURE_SECONDS; the main thread then says so."""
    child = command.started[-1]
    _wait_for_end(child, timing.OWN_FAILURE_SECONDS)
    return child.returncode not in (None, 0)


def _wait_for_end(
    child: children.Child, seconds: float, unless: Callable[[], bool] = lambda: False
) -> None:
    """Waits at most `seconds` for `child` to end, looking at `unless` each probe interval and
    giving up where it holds. From a thread beside the main one too: the main thread sets
    returncode once it has reaped the command (poll() from another would say None while that
    thread waits)."""
    deadline = time.monotonic() + seconds
    while child.returncode is None and time.monotonic() < deadline and not unless():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, min(timing.PROBE_SECONDS, deadline - time.monotonic())))


def _say_how_it_ended(owner: RunOwner, status: int, stopped_by: signal.Signals | None) -> None:
    if status == 0:
        owner.say(RunState.DONE, None)
    elif stopped_by is not None:
        owner.say(RunState.STOPPED, None, signal=stopped_by.name)
    else:
        owner.say(RunState.FAILED, None, exit_status=status)


def _after_command() -> None:
    """Nothing left to pass signals on to: the stopping ones end this process, as they would
    any (scancel), the others are ignored."""
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL if signum in children.STOPPING else signal.SIG_IGN)


# _its_failure, as one supervisor explains its command's failure.
_Explain = Callable[[children.Group, children.Child, ClusterRole], str]
# _end_lost, for one supervisor's command, role and owner.
_EndLost = Callable[[LostPeer], NoReturn]


def _its_failure(
    command: children.Group, child: children.Child, role: ClusterRole, *, keras_3: bool
) -> str:
    """Records the failure of this task's command, with the exception its stderr ended on,
    and says so in words: `its command failed: ValueError: ...`. A traceback through Keras 3,
    which none of the layouts trains, is said with what to run instead."""
    relay = command.relay(child)
    if relay is not None:
        relay.finish()
    why = relay.why_it_failed() if relay is not None and child.returncode > 0 else ""
    failure.record_exit(child.returncode, why)
    if relay is not None and relay.through_keras_3 and not keras_3:
        logging.error(
            "%s: its command's traceback runs through Keras 3 (import keras), which "
            "tf.distribute's MultiWorkerMirroredStrategy and ParameterServerStrategy do not "
            "train (keras-team/keras#20585). HINT: build the model with tf-keras: import "
            "tf_keras as keras (pip install tf-keras), or tf.keras with TF_USE_LEGACY_KERAS=1 "
            "set before TensorFlow is imported; or train it on JAX: with-tfconfig --keras3 "
            "(docs/keras3.md)",
            role.task_id,
        )
    return f"its command failed: {why}" if why else "its command failed"


def _say_failed(role: ClusterRole, why: str = "its command failed") -> None:
    """Answers FAILED on the task's port long enough for every watcher to probe it twice: a
    command that died before its server listened would otherwise be waited for. A task alone
    in its cluster has no watcher to tell, and exits at once."""
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
    with answering.answering(role) as answer:
        answer.append(watchdog.FAILED)
        time.sleep(seconds)


def _run_watched(
    command: children.Group,
    role: ClusterRole,
    watched: dict[str, str],
    *,
    lost: watchdog.OnLost,
    state: TaskState,
    end_lost: _EndLost,
    owner: RunOwner | None,
    its_failure: _Explain,
) -> int:
    """Runs a trainer's or coordinator's command while `watched` are watched; once it exits,
    the run's owner says how, and a failure is recorded and said on the task's port. The
    command's exit status; a lost peer ends the task."""
    (child,) = command.started
    peers = watchdog.PeerWatch(watched, on_lost=lost)
    # A lost peer ends the task even where its killed command does not end (a process in
    # uninterruptible sleep): _end_lost waits for it a while only.
    _wait_for_end(child, math.inf, unless=lambda: state.lost is not None)
    peers.stop()
    if state.lost is not None:
        end_lost(state.lost)
    status = exits.exit_status(child.returncode)
    _after_command()
    if owner is not None:
        _say_how_it_ended(owner, status, state.stopped_by)
    if status != 0:
        if not state.take_end(State.FAILED) and state.lost is not None:
            end_lost(state.lost)
        if state.stopped_by is not None:
            _say_failed(role, f"its command stopped on {state.stopped_by.name}")
        else:
            _say_failed(role, its_failure(command, child, role))
    return status


def _coordinate(role: ClusterRole, status: int) -> int:
    """A ParameterServerStrategy coordinator whose command ended with `status`, watching every
    ps meanwhile (a lost ps fails the run; a lost worker is TensorFlow's to tolerate): once
    it exits 0, says FINISHED, which ends every ps's and worker's command, until the
    parameter servers have gone."""
    if status != 0:
        return status
    logging.info(
        "chief 0 (the coordinator): its command finished; the parameter servers and the "
        "workers end theirs"
    )
    with answering.answering(role) as answer:
        answer.append(watchdog.FINISHED)
        watchdog.until_gone(role.named(PS))
    return 0


def _serve(
    command: children.Group,
    role: ClusterRole,
    lost: watchdog.OnLost,
    state: TaskState,
    end_lost: _EndLost,
    *,
    restarts: int,
    its_failure: _Explain,
) -> int:
    """A task that serves (a ps, a coordinator's worker) until its herald says FINISHED
    (watch_plan.herald), then ends its command, whose server.join() never returns. A ps also
    watches its paired trainers (none with a coordinator) and the other parameter servers. A
    command that fails is started again `restarts` times, each said in the log, unless a
    stopping signal ended it, or a lost peer ends the task."""
    watch = ServerWatch.start(role, lost)
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
    if state.lost is not None:
        end_lost(state.lost)
    if not watch.heard.is_set():
        return _server_ended(
            command, child, role, state, end_lost=end_lost, its_failure=its_failure
        )
    logging.info(
        "%s: %s; ending its command (a server's join() never returns; %s said so)",
        role.task_id,
        "the coordinator finished" if role.coordinator else "every trainer finished",
        next(iter(watch_plan.herald(role))),
    )
    command.stop(timing.END_GRACE_SECONDS)
    say_served(role)
    return 0


def _server_ended(
    command: children.Group,
    child: children.Child,
    role: ClusterRole,
    state: TaskState,
    *,
    end_lost: _EndLost,
    its_failure: _Explain,
) -> int:
    """A serving task's command that ended before its herald said FINISHED: its exit status,
    a failure said and recorded, a stop not."""
    status = exits.exit_status(child.wait())
    _after_command()
    # SLURM signals every process of a step it stops (scancel, a requeue, a time limit):
    # the command may die of it before this supervisor's own copy has come.
    if status != 0 and (state.stopped_by or -child.returncode in children.STOPPING):
        logging.info("%s: its command %s", role.task_id, exits.how_it_ended(child.returncode))
        return status
    if status != 0:
        # The wrapper's own status is news only where a signal ended the command.
        how = exits.how_it_ended(child.returncode)
        logging.error(
            "%s: its command %s; its log above may say why.%s",
            role.task_id,
            f"{how} (exit {status})" if child.returncode < 0 else how,
            _server_failure_hint(role, child.returncode),
        )
        if not state.take_end(State.FAILED) and state.lost is not None:
            end_lost(state.lost)
        _say_failed(role, its_failure(command, child, role))
    return status


class ServerWatch(NamedTuple):
    """The watches of a task that serves (a ps, a coordinator's worker) until its herald says
    FINISHED (watch_plan.herald): `near` its herald and, a ps without a coordinator, its
    paired trainers; `far` the other parameter servers, each released as it says FINISHED
    (it ended its command: not lost). `heard` is set once the herald has said it."""

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
    """Says FINISHED on the port of a task that has served: ps 0 until the other parameter
    servers have gone, as they learn it from ps 0, and a coordinator's ps until its paired
    workers have, as they learn it from their parameter servers."""
    waiting = watch_plan.other_servers(role) if role.role == PS and role.index == 0 else {}
    if role.coordinator and role.role == PS:
        waiting.update(watch_plan.paired_workers(role))
    with answering.answering(role) as answer:
        answer.append(watchdog.FINISHED)
        watchdog.until_gone(waiting)


def _server_failure_hint(role: ClusterRole, returncode: int) -> str:
    """What to do about a serving task's failed command, from a space on; "" for a worker."""
    if role.role != PS:
        return ""
    if role.coordinator:
        return (
            " The coordinator cannot go on without it: run the step again to resume from the "
            "last checkpoint"
        )
    # An exception in the script (Python's exit 1) is what fails a ps of the other layouts;
    # not a signal, a lost peer (3) or a script Python could not open (2).
    return f" {_ps_failure_hint(versions.installed())}" if returncode == 1 else ""


def _ps_failure_hint(found: versions.Installed) -> str:
    """What commonly fails a parameter server's command, as far as the TensorFlow installed
    tells: the supervisor does not read the command's output."""
    mirrored = (
        "a script that trains with MultiWorkerMirroredStrategy fails beside a parameter "
        "server: run it under with-tfconfig --all_reduce"
    )
    if found.tensorflow and not versions.has_estimator_release(found.tensorflow):
        return (
            f"With TensorFlow {found.tensorflow} here, an Estimator script cannot run "
            f"(Estimator needs TensorFlow 2.15), and {mirrored}"
        )
    return mirrored[0].upper() + mirrored[1:]


def say_finished(
    role: ClusterRole, lost: watchdog.OnLost, each_probe: Callable[[], None] = lambda: None
) -> None:
    """A trainer whose command exited 0: waits until each of its children in the tree of
    trainers says FINISHED (its port answering meanwhile that it is alive), then says
    FINISHED itself until its paired parameter servers have gone (they need only see it
    once), and until its parent has seen it: its parent may finish much later. A child lost
    meanwhile is `lost`'s; `each_probe`, called every probe interval while the port answers,
    may end the task (with-tfconfig's, once `lost` took its end: its FAILED then goes out on
    the port that said WAITING, which it could not bind twice)."""
    with answering.answering(role) as answer:
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
        # A command that finished at once (a script rerun with nothing left to train) may
        # finish before its parameter servers listen: their supervisors, which probe this
        # port every PROBE_SECONDS, have yet to hear FINISHED, and would otherwise wait for
        # this task as one still starting, then end as having lost it.
        watchdog.until_gone(watch_plan.paired(role), unseen_for=timing.UNSEEN_SECONDS)
        parent = watch_plan.parent(role)
        if parent is not None:
            _until_finished_or_gone(parent)


def _until_finished_or_gone(address: str) -> None:
    """Returns once the task at `address` says FINISHED, or has not answered for
    timing.LOST_AFTER_SECONDS (lost: its own watchers end the step)."""
    silent_since = None
    while True:
        finished = watchdog.says_finished(address)
        if finished:
            return
        now = time.monotonic()
        if finished is None:
            silent_since = silent_since or now
            if now - silent_since >= timing.LOST_AFTER_SECONDS:
                return
        else:
            silent_since = None
        time.sleep(timing.PROBE_SECONDS)

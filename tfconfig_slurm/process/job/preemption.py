"""A stop: on a signal, whose handler only sets a flag, which trainers read between steps, or
before the job's time limit; and the policy of what a stop does at the end (docs/preemption.md
tells the whole; what_follows.py decides the requeue). No TensorFlow here.

The time limit is kept without SLURM's warning signal: without `#SBATCH --signal=USR1@90` a
time limit sends SIGTERM, then SIGKILL, and nothing requeues the job. So the task that requeues
it asks squeue for the time left (again every minute: `scontrol update TimeLimit=` moves it)
and, `margin` seconds before the limit (at most half the time left at start), sends the
preempt signal to itself, then to the job. The run's owner, where it is another task, only
follows the limit, unless its slower checkpoints widen its margin. The stop never waits on
slurmctld.
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

from absl import logging

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import exits, slurm_commands, timing


def parse_signal(name: str) -> signal.Signals | None:
    """`USR1` or `SIGUSR1` as the signal; '' as None (leave signals alone)."""
    if not name:
        return None
    wanted = "SIG" + name.upper().removeprefix("SIG")
    if wanted == "SIGQUIT":
        raise UsageError(
            "--preempt_signal",
            "is QUIT, which writes every thread's stack to the log instead",
            "give another, e.g. USR1 or USR2; '' to leave signals alone",
        )
    if wanted not in signal.Signals.__members__ or wanted in ("SIGKILL", "SIGSTOP"):
        raise UsageError(
            "--preempt_signal",
            f"is {name!r}, which is not a signal a process can catch",
            "give a name as #SBATCH --signal does, e.g. USR1 or USR2; '' to leave signals alone",
        )
    return signal.Signals[wanted]


# A wait for the steps dispatched before a checkpoint that its line says apart.
_SAID_WAIT_SECONDS = 0.1


class StopRequest:
    """Whether this task was told to stop, and by which signal.

    A handler runs only between two bytecodes of the main thread, which may be blocked in C++
    for good, or hold the event's own lock (a coordinator told twice hung in Event.set): so it
    only notes the signal, and a thread woken by the interpreter's wakeup fd sets the event.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signums: list[signal.Signals] = []
        self._wakeups: socket.socket | None = None
        self.signal_name = ""
        # Whether a stop was asked for (noted).
        self.requested = False
        # A stop before the time limit leaves time for one more (TimeLimit).
        self.longest_checkpoint = 0.0

    def checkpoint_written(self, step: int, seconds: float, waited: float = 0.0) -> None:
        """Says a checkpoint written, `waited` of its `seconds` for the steps dispatched before
        it (Keras 3 on JAX runs ahead of its devices), and keeps the longest."""
        waiting = f", {waited:.2f} s of it waiting for the steps dispatched before it"
        said = waiting if waited >= _SAID_WAIT_SECONDS else ""
        logging.info("checkpoint of step %d written in %.2f s%s", step, seconds, said)
        self.longest_checkpoint = max(self.longest_checkpoint, seconds)

    def listen(self, *signums: signal.Signals | None) -> None:
        """From now on, each of `signums` asks this task to stop; call it from the main thread."""
        self._signums.extend(filter(None, signums))
        self.listen_again()
        if self._wakeups is None:
            reader, writer = socket.socketpair()
            writer.setblocking(False)
            signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            # Kept open for as long as the process lives, as the interpreter writes to it.
            self._wakeups, self._wakeup_writer = reader, writer
            threading.Thread(target=self._read_wakeups, name="signals", daemon=True).start()

    def _read_wakeups(self) -> None:
        assert self._wakeups is not None
        interrupts = 0
        while data := self._wakeups.recv(64):
            for number in data:
                if number not in self._signums:
                    continue
                self.ask(signal.Signals(number).name)
                # Ctrl-C: the first stops at the next step, the second ends the process at once.
                interrupts += number == signal.SIGINT
                if number == signal.SIGINT and interrupts == 1:
                    logging.warning(
                        "SIGINT: stopping at the next step, with a checkpoint; Ctrl-C again ends "
                        "the process at once, without one"
                    )
                elif number == signal.SIGINT:
                    logging.error("SIGINT again: ending at once, without a checkpoint (exit 130)")
                    exits.end_now(128 + signal.SIGINT, "SIGINT again")

    def ask(self, name: str) -> None:
        """Asks this task to stop, as the signal `name` does (TimeLimit)."""
        self.note(name)
        self._event.set()

    def note(self, name: str) -> None:
        """Notes the stop, named by the first signal; only that, and with no lock, so that a
        signal handler may call it (a supervisor that passes the signal on notes it too)."""
        if not self.requested:
            self.signal_name = name
            self.requested = True

    def note_signal(self, number: int) -> None:
        """`note`, for a handler given the signal's `number`."""
        self.note(signal.Signals(number).name)

    def listen_again(self) -> None:
        """Takes the signals back (MultiWorkerMirroredStrategy installs a SIGTERM handler)."""
        for signum in self._signums:
            signal.signal(signum, lambda number, frame: self.note_signal(number))

    @property
    def signum(self) -> signal.Signals | None:
        """The signal that asked for the stop, None before any did."""
        return signal.Signals[self.signal_name] if self.requested else None

    def said(self, agreed: str) -> str:
        """A stop agreed on as `agreed`, said by this task's own signal where one came after
        its peers' (SIGTERM reaches the tasks in any order), so that a requeue signal requeues."""
        return self.signal_name if agreed == PEERS_SIGNAL and self.requested else agreed

    def wait(self, seconds: float | None = None) -> bool:
        """Whether this task was told to stop, waiting up to `seconds` for it."""
        return self._event.wait(seconds)


# What a trainer stops on where another trainer was told to stop, and it was not (yet).
PEERS_SIGNAL = "a peer's signal"


@dataclass(frozen=True)
class StopPolicy:
    """Which signals requeue the job, how often; and the stop before its time limit
    (TimeLimit): the signal it is taken for (None: none), how long before."""

    requeue_on: Collection[str]
    max_requeues: int
    time_limit_signal: str | None = None
    time_limit_margin: float = 0.0


# A stop must leave time for the final checkpoint: twice the longest one, as writes vary.
_CHECKPOINTS_IN_MARGIN = 2.0
# squeue's %L: [days-][hours:]minutes:seconds.
_TIME_LEFT = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")


class NoLimit(NamedTuple):
    """No time left from squeue: why, and whether asking again may give one (squeue failed)."""

    why: str
    again: bool


# squeue's time left for a job, given at most so many seconds to answer.
Ask = Callable[[str, float], Union[float, NoLimit]]


def parse_time_left(text: str) -> float | None:
    """squeue's %L in seconds (`1-02:03:04`, `45:10`); None for UNLIMITED, NOT_SET, INVALID."""
    found = _TIME_LEFT.fullmatch(text.strip())
    if found is None:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def time_left(job: str, seconds: float = timing.SLURM_COMMAND_SECONDS) -> float | NoLimit:
    """Seconds until `job`'s time limit, or why it cannot be known (squeue given `seconds`)."""
    shown = slurm_commands.run(["squeue", "--noheader", f"--jobs={job}", "--format=%L"], seconds)
    if shown is None:
        return NoLimit("squeue cannot be run here, or did not answer", again=True)
    if shown.returncode != 0:
        return NoLimit(f"squeue failed: {shown.stderr.strip() or shown.returncode}", again=True)
    left = parse_time_left(shown.stdout.splitlines()[0] if shown.stdout.strip() else "")
    if left is None:
        why = f"it has none ({shown.stdout.strip() or 'squeue does not list it'})"
        return NoLimit(why, again=False)
    return left


def watch(
    job: SlurmJob,
    stop: StopRequest,
    signal_name: str,
    margin: float,
    *,
    acts: bool = True,
    ask: Ask = time_left,
) -> TimeLimit:
    """Starts watching `job`'s time limit from a thread (without `acts`, only following it)."""
    limit = TimeLimit(job, stop, signal_name, margin, ask, acts)
    threading.Thread(target=limit.keep, name="time-limit", daemon=True).start()
    return limit


@dataclass
class TimeLimit:
    """A job's time limit, followed as it moves, and the stop before it."""

    job: SlurmJob
    stop: StopRequest
    signal_name: str
    margin: float
    ask: Ask
    acts: bool
    # Set by the watching thread once squeue has said (None: not known, or no limit).
    deadline: float | None = None

    def due(self) -> bool:
        """Whether the stop before the limit is due (the run stops for the time limit)."""
        deadline = self.deadline
        return (
            deadline is not None
            and time.time() >= deadline - self._margin() - timing.LIMIT_MOVED_SECONDS
        )

    def _margin(self) -> float:
        """The margin, or the time for this task's checkpoints, where that is more."""
        return max(self.margin, _CHECKPOINTS_IN_MARGIN * self.stop.longest_checkpoint)

    def keep(self) -> None:
        job = self.job.name
        deadline = self._limit_said()
        if deadline is None:
            return
        asked, said, last_look = time.monotonic(), self.margin, 0.0
        while not self.stop.requested:
            margin = self._margin()
            # Said in whole seconds, as the log shows it: not again for a tenth more.
            if round(margin) > round(said):
                said = margin
                logging.info(
                    "job %s: this task's checkpoints take up to %.1f s; the run now stops at "
                    "%s, %.0f s before the time limit",
                    job,
                    self.stop.longest_checkpoint,
                    _clock(deadline - margin),
                    margin,
                )
            stop_at = deadline - margin
            if time.time() >= stop_at:
                # Where this task's checkpoints set the margin, the other task is late.
                if self.acts or margin > self.margin:
                    self._stop_the_job(deadline - time.time())
                return
            # Asked every LIMIT_POLL_SECONDS, and a last look within FINAL_LOOK_SECONDS of the stop.
            in_final = time.time() >= stop_at - timing.FINAL_LOOK_SECONDS
            if (
                in_final and last_look != stop_at
            ) or time.monotonic() - asked >= timing.LIMIT_POLL_SECONDS:
                seconds = min(timing.SLURM_COMMAND_SECONDS, max(1.0, stop_at - time.time()))
                left, asked = self.ask(job, seconds), time.monotonic()
                if in_final:
                    last_look = stop_at
                if (
                    isinstance(left, float)
                    and abs(time.time() + left - deadline) > timing.LIMIT_MOVED_SECONDS
                ):
                    self.deadline = deadline = time.time() + left
                    self._say(
                        "job %s's time limit moved to %s: this run now stops at %s",
                        job,
                        _clock(deadline),
                        _clock(deadline - margin),
                    )
                continue
            wake = stop_at - timing.FINAL_LOOK_SECONDS if last_look != stop_at else stop_at
            poll = asked + timing.LIMIT_POLL_SECONDS - time.monotonic()
            if self.stop.wait(max(0.0, min(timing.LIMIT_LOOK_SECONDS, poll, wake - time.time()))):
                return

    def _limit_said(self) -> float | None:
        """The job's deadline, said with the stop before it; None where it has no limit. squeue
        is asked until it says something, ever less often while it fails."""
        job, wait = self.job.name, timing.LIMIT_RETRY_SECONDS
        left = self.ask(job, timing.SLURM_COMMAND_SECONDS)
        if isinstance(left, NoLimit) and left.again:
            self._say(
                "job %s: its time limit cannot be read yet (%s); asking squeue again, at "
                "least every %.0f s, and until then the run stops early only on %s",
                job,
                left.why,
                timing.LIMIT_POLL_SECONDS,
                self.signal_name,
            )
        while isinstance(left, NoLimit) and left.again:
            if self.stop.wait(wait):
                return None
            wait = min(2 * wait, timing.LIMIT_POLL_SECONDS)
            left = self.ask(job, timing.SLURM_COMMAND_SECONDS)
        if isinstance(left, NoLimit):
            if not self.stop.requested:
                self._say(
                    "job %s: no time limit to stop before (%s); the run stops early only on %s",
                    job,
                    left.why,
                    self.signal_name,
                )
            return None
        self.margin = min(self.margin, left / 2)
        self.deadline = deadline = time.time() + left
        self._say(
            "job %s ends at its time limit at %s: this run stops at %s, %.0f s before, "
            "with a checkpoint and the requeue, as on %s",
            job,
            _clock(deadline),
            _clock(deadline - self.margin),
            self.margin,
            self.signal_name,
        )
        return deadline

    def _say(self, message: str, *arguments: object) -> None:
        """Logs, in the task that acts; the other only follows."""
        if self.acts:
            logging.info(message, *arguments)

    def _stop_the_job(self, left: float) -> None:
        job, name = self.job.name, self.signal_name.removeprefix("SIG")
        logging.warning(
            "job %s reaches its time limit in %.0f s: stopping every task at its next step "
            "with a checkpoint, as on %s (scancel --signal=%s %s)",
            job,
            left,
            self.signal_name,
            name,
            job,
        )
        # This task first: slurmctld may be slow, and scancel miss a batch script's python.
        self.stop.ask(self.signal_name)
        problem = slurm_commands.failure(["scancel", f"--signal={name}", job])
        if problem:
            logging.error(
                "scancel --signal could not reach the job's other tasks (%s): only this task "
                "stops; the others stop when SLURM ends the job",
                problem,
            )


def _clock(epoch: float) -> str:
    """The time of day, with the date where it is not today."""
    when = time.localtime(epoch)
    today = when[:3] == time.localtime()[:3]
    return time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", when)

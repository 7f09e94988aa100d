"""Preemption and time limits: a signal asks every task to stop at a step boundary, and the
job requeues itself to resume from the checkpoint written there.

SLURM warns a job before its time limit or a preemption when asked to (`#SBATCH
--signal=USR1@90`: SIGUSR1 to every task of every step, 90 s ahead). Without that warning a
time limit, `scancel` or a preemption sends SIGTERM, and SIGKILL after KillWait (30 s by
default): SIGTERM stops training the same way, and requeues only when asked to
(`--requeue_on_sigterm`; SLURM requeues preempted jobs itself where PreemptMode says so).
A handler only sets a flag: trainers look at it between steps (each backend's hook or
callback), the chief writes its final checkpoint once every worker has stopped, and the first
parameter server, which sees every trainer finish, requeues the job with `scontrol requeue` (array
tasks by their own id), or where SLURM refuses, submits it again to go on after it
(process/job/what_follows.py decides which). The requeued run (SLURM_RESTART_COUNT > 0)
resumes from that checkpoint. A run requeued or continued --max_requeues times already is not
requeued again, and says so.

No TensorFlow here.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Collection
from dataclasses import dataclass
from types import FrameType

from absl import logging

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import exits


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

    Python runs a signal handler in the main thread, and only between two of its bytecodes:
    a trainer blocked in TensorFlow's C++ (a step waiting on a dead parameter server) would
    not know it was told to stop until that call returned, if ever. So the signals also
    reach a thread at once, through the interpreter's wakeup file descriptor, which its C
    handler writes each signal to.

    The handler itself only notes the signal, and the thread sets the event: a handler runs
    between two bytecodes of the main thread, which may be inside that event's own lock (a
    coordinator told twice, by scancel and by its supervisor, hung for good in Event.set).
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signums: list[signal.Signals] = []
        self._wakeups: socket.socket | None = None
        self.signal_name = ""
        self._noted = False
        # The longest this task took to write a checkpoint: a stop before the time limit
        # must leave it time for one more (process/job/time_limit.py). A float is read whole.
        self.longest_checkpoint = 0.0

    def checkpoint_written(self, step: int, seconds: float, waited: float = 0.0) -> None:
        """A backend wrote the checkpoint of `step` in `seconds`, `waited` of them for the
        steps dispatched before it to be done (Keras 3 on JAX runs ahead of its devices):
        said, and kept for the stop before the time limit, which waits for those too."""
        if waited >= _SAID_WAIT_SECONDS:
            logging.info(
                "checkpoint of step %d written in %.2f s, %.2f s of it waiting for the steps "
                "dispatched before it",
                step,
                seconds,
                waited,
            )
        else:
            logging.info("checkpoint of step %d written in %.2f s", step, seconds)
        self.longest_checkpoint = max(self.longest_checkpoint, seconds)

    def listen(self, *signums: signal.Signals | None) -> None:
        """From now on, each of `signums` asks this task to stop; nothing else happens on it.
        Call it from the main thread."""
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
                if number == signal.SIGINT:
                    interrupts += 1
                    _interrupted(interrupts)

    def ask(self, name: str) -> None:
        """Asks this task to stop, as the signal `name` does (process/job/time_limit.py)."""
        self.note(name)
        self._event.set()

    def note(self, name: str) -> None:
        """Notes the stop, as the signal `name` asks for it; only that, so that a signal
        handler may call it: a process that acts on the signal otherwise (passes it on to its
        command, with-tfconfig's supervisor and `tfconfig-slurm srun`) notes it here too. The
        first signal names the stop. No lock: the handler may run with it held."""
        if not self._noted:
            self.signal_name = name
            self._noted = True

    def note_signal(self, number: int) -> None:
        """`note`, for a handler given the signal's `number`."""
        self.note(signal.Signals(number).name)

    def listen_again(self) -> None:
        """Takes the signals back from whatever took them since (MultiWorkerMirroredStrategy
        installs its own SIGTERM handler, which only logs)."""

        def handler(number: int, frame: FrameType | None) -> None:
            # Only a flag: the handler may run in the middle of anything, even another
            # Event.set; the signals thread sets the event.
            self.note_signal(number)

        for signum in self._signums:
            signal.signal(signum, handler)

    @property
    def requested(self) -> bool:
        return self._noted

    @property
    def signum(self) -> signal.Signals | None:
        """The signal that asked for the stop, None before any did."""
        return signal.Signals[self.signal_name] if self._noted else None

    def said(self, agreed: str) -> str:
        """How a stop the trainers agreed on as `agreed` is said at this task's end: by its own
        signal where one came after its peers' (SIGTERM to every task reaches them in any
        order), so that a requeue signal requeues and the report names it."""
        return self.signal_name if agreed == PEERS_SIGNAL and self._noted else agreed

    def wait(self, seconds: float | None = None) -> bool:
        """Returns once this task is told to stop (for a thread that acts on it), or after
        `seconds`: whether it was told."""
        return self._event.wait(seconds)


# What a trainer stops on where another trainer was told to stop, and it was not (yet).
PEERS_SIGNAL = "a peer's signal"


def _interrupted(times: int) -> None:
    """Ctrl-C at a terminal: the first stops at the next step, with its checkpoint, as any stop
    signal; the second ends the process at once, where a task waits for a peer that never
    started (up to timing.START_SECONDS) or a step that takes long."""
    if times == 1:
        logging.warning(
            "SIGINT: stopping at the next step, with a checkpoint; Ctrl-C again ends the "
            "process at once, without one"
        )
        return
    logging.error("SIGINT again: ending at once, without a checkpoint (exit 130)")
    exits.end_now(128 + signal.SIGINT, "SIGINT again")


@dataclass(frozen=True)
class StopPolicy:
    """What a stop on a signal does at the end: which signals requeue the job, how often;
    and the stop before the job's time limit (process/job/time_limit.py): the signal it is
    taken for (None: none), how many seconds before the limit."""

    requeue_on: Collection[str]
    max_requeues: int
    time_limit_signal: str | None = None
    time_limit_margin: float = 0.0

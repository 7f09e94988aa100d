"""A stop signal: its handler only sets a flag, which trainers read between steps, and the
policy of what a stop does at the end (docs/preemption.md tells the whole; what_follows.py
decides the requeue). No TensorFlow here."""

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

    A handler runs only between two bytecodes of the main thread, which may be blocked in C++
    for good, or hold the event's own lock (a coordinator told twice hung in Event.set): so it
    only notes the signal, and a thread woken by the interpreter's wakeup fd sets the event.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._signums: list[signal.Signals] = []
        self._wakeups: socket.socket | None = None
        self.signal_name = ""
        self._noted = False
        # A stop before the time limit leaves time for one more (time_limit.py).
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
        """Asks this task to stop, as the signal `name` does (process/job/time_limit.py)."""
        self.note(name)
        self._event.set()

    def note(self, name: str) -> None:
        """Notes the stop, named by the first signal; only that, and with no lock, so that a
        signal handler may call it (a supervisor that passes the signal on notes it too)."""
        if not self._noted:
            self.signal_name = name
            self._noted = True

    def note_signal(self, number: int) -> None:
        """`note`, for a handler given the signal's `number`."""
        self.note(signal.Signals(number).name)

    def listen_again(self) -> None:
        """Takes the signals back (MultiWorkerMirroredStrategy installs a SIGTERM handler)."""

        def handler(number: int, frame: FrameType | None) -> None:
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
        """A stop agreed on as `agreed`, said by this task's own signal where one came after
        its peers' (SIGTERM reaches the tasks in any order), so that a requeue signal requeues."""
        return self.signal_name if agreed == PEERS_SIGNAL and self._noted else agreed

    def wait(self, seconds: float | None = None) -> bool:
        """Whether this task was told to stop, waiting up to `seconds` for it."""
        return self._event.wait(seconds)


# What a trainer stops on where another trainer was told to stop, and it was not (yet).
PEERS_SIGNAL = "a peer's signal"


@dataclass(frozen=True)
class StopPolicy:
    """Which signals requeue the job, how often; and the stop before its time limit
    (time_limit.py): the signal it is taken for (None: none), how long before."""

    requeue_on: Collection[str]
    max_requeues: int
    time_limit_signal: str | None = None
    time_limit_margin: float = 0.0

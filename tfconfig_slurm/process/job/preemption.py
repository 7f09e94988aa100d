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
(process/job/continuation.py). The requeued run (SLURM_RESTART_COUNT > 0) resumes from that
checkpoint. A run requeued or continued --max_requeues times already is not requeued again,
and says so.

No TensorFlow here.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from absl import logging

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import EXIT_NOT_REQUEUED, UsageError
from tfconfig_slurm.process import exits, slurm_commands
from tfconfig_slurm.process.job import continuation
from tfconfig_slurm.process.records import attempts


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
        self._note(name)
        self._event.set()

    def _note(self, name: str) -> None:
        # The first signal names the stop. No lock: the signal handler calls it.
        if not self._noted:
            self.signal_name = name
            self._noted = True

    def listen_again(self) -> None:
        """Takes the signals back from whatever took them since (MultiWorkerMirroredStrategy
        installs its own SIGTERM handler, which only logs)."""

        def handler(number: int, frame: FrameType | None) -> None:
            # Only a flag: the handler may run in the middle of anything, even another
            # Event.set; the signals thread sets the event.
            self._note(signal.Signals(number).name)

        for signum in self._signums:
            signal.signal(signum, handler)

    @property
    def requested(self) -> bool:
        return self._noted

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


def after_stop(
    environ: Mapping[str, str],
    job: SlurmJob | None,
    stopped_on: str,
    policy: StopPolicy,
    model_dir: Path,
) -> int:
    """What a task of the SLURM job `job` (None outside SLURM), run in `environ`, does last
    once it stopped on a signal: requeues the job when the signal is one of the policy's
    `requeue_on` (or has it go on in a new job, process/job/continuation.py), else says how to
    resume; the exit status this task should end with."""
    if stopped_on in policy.requeue_on:
        return requeue(environ, job, policy.max_requeues, stopped_on, model_dir)
    if job is None:
        logging.info(
            "stopped on %s with a checkpoint of every step taken: %s",
            stopped_on,
            _resume(model_dir),
        )
        return 0
    logging.info(
        "stopped on %s with a checkpoint of every step taken; not requeueing the job (a "
        "--preempt_signal requeues it, and SIGTERM with --requeue_on_sigterm): %s",
        stopped_on,
        _resume(model_dir),
    )
    return 0


def _resume(model_dir: Path) -> str:
    # The directory, not the experiment id: a script's user (the Python API) names none.
    return f"run again with the same model directory, {model_dir}, to resume"


def requeue(
    environ: Mapping[str, str],
    job: SlurmJob | None,
    max_requeues: int,
    stopped_on: str,
    model_dir: Path,
) -> int:
    """Puts the SLURM job `job` back in the queue, or where SLURM refuses, submits it again
    (from `environ`, this task's) to go on after it; the exit status this task should end
    with."""
    if job is None:
        logging.warning(
            "stopped on %s outside a SLURM job: nothing to requeue; %s",
            stopped_on,
            _resume(model_dir),
        )
        return 0
    target, restarts = job.name, attempts.count(model_dir, job).requeued
    if restarts >= max_requeues:
        logging.error(
            "job %s stopped on %s and the run was requeued or continued %d times already "
            "(--max_requeues=%d): not requeueing it again. HINT: submit it again with the same "
            "experiment id to resume from the checkpoint, or raise --max_requeues",
            target,
            stopped_on,
            restarts,
            max_requeues,
        )
        return EXIT_NOT_REQUEUED
    problem = slurm_commands.requeue(target)
    if not problem:
        logging.info(
            "stopped on %s; requeued job %s (restart %d of at most %d): it resumes from the "
            "checkpoint",
            stopped_on,
            target,
            restarts + 1,
            max_requeues,
        )
        return 0
    return _requeue_refused(
        job, problem, environ=environ, max_requeues=max_requeues, stopped_on=stopped_on,
        model_dir=model_dir,
    )  # fmt: skip


def _requeue_refused(
    job: SlurmJob,
    problem: str,
    *,
    environ: Mapping[str, str],
    max_requeues: int,
    stopped_on: str,
    model_dir: Path,
) -> int:
    """After `scontrol requeue` failed, saying `problem`, the exit status this task should end
    with. A requeue that failed may have been done all the same (slurmctld answered too
    late), and one that SLURM may do failed for another reason: a new job in either case would
    leave two jobs queued for one run. Only a job that may not requeue goes on in one."""
    target, restarts = job.name, attempts.count(model_dir, job).requeued
    record = continuation.job_record(target)
    if isinstance(record, str):
        why = f"its state cannot be read ({record})"
    elif continuation.requeued(record, job.restart_count):
        logging.info(
            "stopped on %s; `scontrol requeue %s` said %s, but the job was requeued "
            "(Restarts=%s): it resumes from the checkpoint",
            stopped_on,
            target,
            problem,
            record["Restarts"],
        )
        return 0
    elif record.get("Requeue") != "0":
        why = "SLURM may requeue it (Requeue=1), so it does not go on in a new job beside it"
    else:
        try:
            next_job = continuation.submit(job, model_dir, environ, record)
        except continuation.ContinuationError as error:
            why = f"the run cannot go on in a new job: {error}"
        else:
            logging.info(
                "stopped on %s; SLURM refused to requeue job %s (%s), so the run goes on in job "
                "%s, its batch script submitted again to start once job %s ends (continuation "
                "%d of at most %d), asking for %s (what SLURM does not show, %s, comes from "
                "the script's #SBATCH lines): it resumes from the checkpoint",
                stopped_on,
                target,
                problem,
                next_job,
                target,
                restarts + 1,
                max_requeues,
                " ".join(continuation.resources(record)) or "what the script asks for",
                continuation.NOT_CARRIED,
            )
            return 0
    logging.error(
        "stopped on %s, but `scontrol requeue %s` failed (%s), and %s. HINT: submit the job "
        "again with the same experiment id to resume from the checkpoint",
        stopped_on,
        target,
        problem,
        why,
    )
    return EXIT_NOT_REQUEUED

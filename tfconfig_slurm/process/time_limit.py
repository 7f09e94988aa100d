"""A job's time limit, kept without SLURM's warning signal.

Without `#SBATCH --signal=USR1@90` a time limit sends SIGTERM, then SIGKILL 30 s later, and
nothing requeues the job. So the task that requeues the job (process/lifecycle.py) asks SLURM
how long the job has left (`squeue --format=%L`, again every POLL_SECONDS: `scontrol update
TimeLimit=` moves it), and `margin` seconds before the limit sends the preempt signal to every
task of the job (`scancel --signal=USR1 JOB`) and to itself: the run stops at the next step
with a checkpoint and the job requeues itself, exactly as on the warning signal, and
whichever comes first wins. The margin is at most half of what the job had left when the run
started, so that a short job trains before it stops. The run's owner, where it is another
task, follows the limit too, to say that the run stopped for it: at most two squeue a minute
per job, so that thousands of tasks do not each ask slurmctld.

No TensorFlow here.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable, Union

from absl import logging

from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.process import slurm_commands
from tfconfig_slurm.process.preemption import StopRequest

POLL_SECONDS = 60.0
# A limit that moved by less than this did not move: squeue's own rounding.
_MOVED_SECONDS = 5.0
# squeue's %L: [days-][hours:]minutes:seconds.
_TIME_LEFT = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")

Ask = Callable[[str], Union[float, str]]


def parse_time_left(text: str) -> float | None:
    """squeue's %L in seconds (`1-02:03:04`, `45:10`); None for UNLIMITED, NOT_SET, INVALID."""
    found = _TIME_LEFT.fullmatch(text.strip())
    if found is None:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def time_left(job: str) -> float | str:
    """Seconds until `job`'s time limit, or why it cannot be known (a sentence)."""
    shown = slurm_commands.run(["squeue", "--noheader", f"--jobs={job}", "--format=%L"])
    if shown is None:
        return "squeue cannot be run here"
    if shown.returncode != 0:
        return f"squeue failed: {shown.stderr.strip() or shown.returncode}"
    left = parse_time_left(shown.stdout.splitlines()[0] if shown.stdout.strip() else "")
    if left is None:
        return f"it has none ({shown.stdout.strip() or 'squeue does not list it'})"
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
    """Starts watching `job`'s time limit (see the module), from a thread: squeue is not
    waited for at start. A task that does not act (the run's owner, beside the task that
    requeues) only follows the limit, to say why the run stopped."""
    limit = TimeLimit(job, stop, signal_name, margin=margin, ask=ask, acts=acts)
    threading.Thread(target=limit.keep, name="time-limit", daemon=True).start()
    return limit


class TimeLimit:
    """A job's time limit, followed as it moves, and the stop before it."""

    def __init__(
        self,
        job: SlurmJob,
        stop: StopRequest,
        signal_name: str,
        *,
        margin: float,
        ask: Ask,
        acts: bool,
    ) -> None:
        self.job, self.stop, self.signal_name = job, stop, signal_name
        self.margin, self._ask, self._acts = margin, ask, acts
        # Set by the watching thread once squeue has said (None: not known, or no limit);
        # a float is read whole.
        self.deadline: float | None = None

    def due(self) -> bool:
        """Whether the stop before the limit is due (the run stops for the time limit)."""
        deadline = self.deadline
        return deadline is not None and time.time() >= deadline - self.margin - _MOVED_SECONDS

    def keep(self) -> None:
        job = self.job.name
        left = self._ask(job)
        if isinstance(left, str):
            self._say(
                "job %s: no time limit to stop before (%s); the run stops early only on %s",
                job,
                left,
                self.signal_name,
            )
            return
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
        while not self.stop.requested:
            now = time.time()
            if now >= deadline - self.margin:
                if self._acts:
                    self._stop_the_job(deadline - now)
                return
            if self.stop.wait(min(POLL_SECONDS, deadline - self.margin - now)):
                return
            left = self._ask(job)
            if isinstance(left, float) and abs(time.time() + left - deadline) > _MOVED_SECONDS:
                self.deadline = deadline = time.time() + left
                self._say(
                    "job %s's time limit moved to %s: this run now stops at %s",
                    job,
                    _clock(deadline),
                    _clock(deadline - self.margin),
                )

    def _say(self, message: str, *arguments: object) -> None:
        """Logs, in the task that acts; the other only follows."""
        if self._acts:
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
        problem = slurm_commands.failure(["scancel", f"--signal={name}", job])
        if problem:
            logging.error(
                "scancel --signal could not reach the job's other tasks (%s): only this task "
                "stops; the others stop when SLURM ends the job",
                problem,
            )
        # This task may run outside any step scancel reaches (a batch script's own python).
        self.stop.ask(self.signal_name)


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))

"""The package's own errors, and the exit statuses a task of ours ends with.

The commands print an error as one line (culprit, problem, hint) and exit with
ExitStatus.REFUSED; nothing else of ours reaches a user as a traceback.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """How a task of ours ended, as its exit status says it to srun, a supervisor and the
    batch script's restart (process/job/what_follows.py)."""

    # Trained to its end, or stopped on a signal with a checkpoint (and requeued, where asked).
    DONE = 0
    # The run's code raised: Python's own status for an exception not caught.
    FAILED = 1
    # A user can fix the input: the one line said what and how.
    REFUSED = 2
    # The watchdog ended the task for a lost member of its cluster: srun --kill-on-bad-exit or
    # a supervisor then ends the rest of the step.
    PEER_LOST = 3
    # Stopped on a signal that asks for a requeue, with a checkpoint, but the job could not
    # requeue (not a batch job, --no-requeue, or --max_requeues reached).
    NOT_REQUEUED = 4
    # A trainer made no step for its bound (process/task/hang_watch.py), for the step to start
    # again.
    HUNG = 5


class TfconfigSlurmError(Exception):
    """A problem a user can fix: `culprit` is the variable or flag, `hint` how to fix it."""

    def __init__(self, culprit: str, problem: str, hint: str) -> None:
        super().__init__(f"{culprit}: {problem}")
        self.culprit = culprit
        self.problem = problem
        self.hint = hint

    def one_line(self) -> str:
        # A problem that ends in a question ("did you mean --x?") takes no full stop after it.
        end = "" if self.problem.endswith(("?", ".")) else "."
        return f"{self.culprit}: {self.problem}{end} HINT: {self.hint}"

    def __str__(self) -> str:
        # The hint too: a script that lets the error through shows it in its traceback.
        return self.one_line()


class SlurmEnvironmentError(TfconfigSlurmError):
    """A SLURM variable is missing, garbled, or disagrees with the others."""


class LayoutError(TfconfigSlurmError):
    """The tasks SLURM started cannot be laid out as asked (GPUs, roles, trainers)."""


class InstallError(TfconfigSlurmError):
    """What is installed cannot run what was asked: TensorFlow, its extras, Python."""


class UsageError(TfconfigSlurmError):
    """A command-line flag has a value the tool cannot use."""

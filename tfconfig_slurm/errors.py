"""The package's own errors: each names its culprit, says what was expected, and carries a hint.

The command-line tools print one of these as a single line and exit with status 2; nothing
else of ours reaches a user as a traceback.
"""

from __future__ import annotations

USAGE_EXIT_CODE = 2


class TfconfigSlurmError(Exception):
    """A problem a user can fix: `culprit` is the variable or flag, `hint` how to fix it."""

    def __init__(self, culprit: str, problem: str, hint: str) -> None:
        super().__init__(f"{culprit}: {problem}")
        self.culprit = culprit
        self.problem = problem
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.culprit}: {self.problem}. HINT: {self.hint}"


class SlurmEnvironmentError(TfconfigSlurmError):
    """A SLURM variable is missing, garbled, or disagrees with the others."""


class LayoutError(TfconfigSlurmError):
    """The tasks SLURM started cannot be laid out as asked (GPUs, roles, trainers)."""


class InstallError(TfconfigSlurmError):
    """What is installed cannot run what was asked: TensorFlow, its extras, Python."""


class UsageError(TfconfigSlurmError):
    """A command-line flag has a value the tool cannot use."""

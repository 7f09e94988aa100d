"""Whether a job step that failed is worth starting again in the same job, from its latest
checkpoint: where no code of the user's failed (a task killed with SIGKILL, by a person or the
out-of-memory killer, or a peer that stopped answering), a restart loses at most a checkpoint
interval; where it did (an exception, bad input, a crash signal) or the cause is unknown, the
same failure would come again, and the job ends. A restart that failed before it trained a
step does not loop either. No TensorFlow here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tfconfig_slurm.errors import USAGE_EXIT_CODE
from tfconfig_slurm.process.failure import Failure

# srun names a task's node and its rank, and how it ended ("node2: task 3: Killed"), or
# several ranks ("node2: tasks 3-5: Exited with exit code 2").
_SRUN_TASK = re.compile(r"[^ \n]+: tasks? ([0-9]+)[-,0-9]*: (.*)")
# The out-of-memory killer, as slurmstepd reports it ("Detected 1 oom_kill event").
_OOM_KILL = re.compile(r"oom[-_ ]kill", re.I)


class Verdict(NamedTuple):
    """Whether to start the step again, and why (for the batch script's line)."""

    again: bool
    why: str


def verdict(first: Failure | None, srun_said: str, *, trained: bool) -> Verdict:
    """What the step's first failure (its record, else srun's messages `srun_said`) says of a
    restart; `trained` says whether the failed step took a step of training at all."""
    if not trained:
        return Verdict(again=False, why="it failed before it trained a step")
    if first is not None:
        return _of_record(first)
    if _OOM_KILL.search(srun_said):
        return Verdict(again=True, why="the out-of-memory killer ended a task")
    # The first task srun names: those it killed after it (--kill-on-bad-exit) say nothing.
    named = first_task_said(srun_said)
    if named is not None and named[2].strip() == "Killed":
        return Verdict(again=True, why="a task was killed")
    return Verdict(again=False, why="srun names no task killed: the tasks ended of themselves")


def first_task_said(srun_said: str) -> re.Match[str] | None:
    """srun's first line about a task: the whole line, the task's rank, and how it ended."""
    return _SRUN_TASK.search(srun_said)


def _of_record(first: Failure) -> Verdict:
    if first.seen_by is not None:
        if first.exit_status is None and first.what.startswith("stopped answering"):
            return Verdict(again=True, why=f"{first.task} stopped answering")
        # A peer that said its command failed: the command's own error.
        return Verdict(again=False, why=f"{first.task}'s command failed")
    # SIGKILL, as by a person or the out-of-memory killer; a crash (SIGSEGV, SIGABRT) would
    # come again.
    if first.what == "its command was killed by SIGKILL":
        return Verdict(again=True, why=f"{first.task} was killed by SIGKILL")
    if first.exit_status == USAGE_EXIT_CODE:
        return Verdict(again=False, why="its input was refused")
    return Verdict(again=False, why="an error in the run's code")

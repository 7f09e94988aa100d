"""Whether a job step that failed is worth starting again in the same job, from its latest
checkpoint: where no code of the user's failed (a task killed by a signal, the out-of-memory
killer, a peer that stopped answering), a restart loses at most a checkpoint interval; where
it did (an exception, bad input) or the cause is unknown, the same failure would come again,
and the job ends. A restart that failed before it trained a step does not loop either.
No TensorFlow here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tfconfig_slurm.errors import USAGE_EXIT_CODE
from tfconfig_slurm.process.failure import Failure

# srun's words for a task a signal ended ("node2: task 3: Killed"), the out-of-memory
# killer's included ("Detected 1 oom_kill event").
_KILLED = re.compile(r": tasks? [0-9][-,0-9]*: (Killed|Terminated)|oom[-_ ]kill", re.I)


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
    if _KILLED.search(srun_said):
        return Verdict(again=True, why="a task was killed")
    return Verdict(again=False, why="srun names no task killed: the tasks ended of themselves")


def _of_record(first: Failure) -> Verdict:
    if first.seen_by is not None:
        if first.exit_status is None and first.what.startswith("stopped answering"):
            return Verdict(again=True, why=f"{first.task} stopped answering")
        # A peer that said its command failed: the command's own error.
        return Verdict(again=False, why=f"{first.task}'s command failed")
    if first.what.startswith("its command was killed by"):
        return Verdict(again=True, why=f"{first.task} {first.what.removeprefix('its command ')}")
    if first.exit_status == USAGE_EXIT_CODE:
        return Verdict(again=False, why="its input was refused")
    return Verdict(again=False, why="an error in the run's code")

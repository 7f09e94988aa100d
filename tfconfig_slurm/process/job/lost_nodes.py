"""A node that left the job: where a node of a `--no-kill` job fails, srun waits on for its
tasks, and only the job's record says that it is gone; `NodeWatch` ends srun then, for the
step to start again on the nodes left. No TensorFlow here."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from hostlist import collect_hostlist

from tfconfig_slurm.cluster.step import Allocation, SlurmJob, expand_nodes
from tfconfig_slurm.errors import SlurmEnvironmentError
from tfconfig_slurm.process import slurm_commands, timing
from tfconfig_slurm.process.job import continuation


def nodes_now(job: SlurmJob) -> tuple[str, ...] | None:
    """The nodes `job` holds now, as slurmctld says; None where it cannot say."""
    return nodes_of(continuation.job_record(job.name))


def nodes_of(record: Mapping[str, str] | str) -> tuple[str, ...] | None:
    """The nodes a job's record lists; None where there is none, or it lists none."""
    return None if isinstance(record, str) else _expanded(record.get("NodeList", "")) or None


def gone(held: Sequence[str], now: Sequence[str] | None) -> tuple[str, ...]:
    """The nodes of `held` that the job no longer holds."""
    return () if now is None else tuple(node for node in held if node not in set(now))


def down(nodes: Sequence[str]) -> tuple[str, ...]:
    """Those of `nodes` that Slurm says failed: down, failed, or not responding (`*`)."""
    if not nodes:
        return ()
    shown = slurm_commands.run(["scontrol", "show", "node", collect_hostlist(list(nodes))])
    if shown is None or shown.returncode != 0:
        return ()
    records = map(continuation.parse_record, re.split(r"\n\s*\n", shown.stdout.strip()))
    failed = {
        record.get("NodeName")
        for record in records
        if any(word in record.get("State", "") for word in ("DOWN", "FAIL", "NOT_RESPONDING", "*"))
    }
    return tuple(node for node in nodes if node in failed)


# srun's options that size a step by nodes or tasks: srun refuses them on the nodes left.
_SIZING = ("-N", "--nodes", "-n", "--ntasks", "-w", "--nodelist")
# srun's lines that say a task ended, or a node failed: the watch starts at the first.
_ENDED = re.compile(r": tasks? [0-9][-,0-9]*: |[Nn]ode failure|NODE FAILURE")


def sized_by(srun_args: Sequence[str]) -> str | None:
    """The first of srun's options before its command that sizes the step; None where none."""
    for index, word in enumerate(srun_args):
        option = word.split("=", 1)[0]
        if option in _SIZING or (option[:2] in _SIZING and len(option) > 2 and option[1] != "-"):
            return word
        # The command: a word that is no option, nor the value of a short one before it.
        if not word.startswith("-") and not (
            index and len(srun_args[index - 1]) == 2 and srun_args[index - 1].startswith("-")
        ):
            return None
    return None


def ended(line: str) -> bool:
    """Whether srun's `line` says that a task ended or a node failed."""
    return _ENDED.search(line) is not None


class NodeWatch:
    """Once `noticed()` (srun said a task ended), watches the nodes of `job` while `srun` runs
    a step on `held`, and ends srun where one left; `left` then names them."""

    def __init__(self, job: SlurmJob, held: Sequence[str], srun: subprocess.Popen[bytes]) -> None:
        self._job = job
        self._held = tuple(held)
        self._srun = srun
        self._thread: threading.Thread | None = None
        self.left: tuple[str, ...] = ()

    def noticed(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="node-watch", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        # Often while a node's failure may still be declared (SlurmdTimeout), then seldom.
        seldom = time.monotonic() + timing.NODE_WATCH_OFTEN_SECONDS
        while self._srun.poll() is None:
            left = gone(self._held, nodes_now(self._job))
            if left and self._srun.poll() is None:
                self.left = left
                # Slurm killed the tasks on the nodes left (seen of plain `sleep` tasks).
                self._srun.kill()
                return
            often = time.monotonic() < seldom
            try:
                self._srun.wait(
                    timing.NODE_WATCH_SECONDS if often else timing.NODE_WATCH_SELDOM_SECONDS
                )
            except subprocess.TimeoutExpired:
                continue


def without(record: Mapping[str, str], held: Allocation, left: Sequence[str]) -> dict[str, str]:
    """`record`, asking for as many nodes as the job had, none of those that `left` it."""
    excluded = (*_expanded(record.get("ExcNodeList", "")), *left)
    asked = _expanded(record.get("ReqNodeList", ""))
    return {
        **record,
        "NumNodes": str(len(held.nodes)),
        "ExcNodeList": collect_hostlist(list(dict.fromkeys(excluded))),
        "ReqNodeList": "" if set(asked) & set(left) else record.get("ReqNodeList", ""),
    }


def _expanded(nodes: str) -> tuple[str, ...]:
    """A hostlist of a job's record; none where it names none ("(null)") or is garbled."""
    if nodes in continuation.NO_VALUE:
        return ()
    try:
        return expand_nodes("scontrol's record", nodes, SlurmEnvironmentError, "")
    except SlurmEnvironmentError:
        return ()

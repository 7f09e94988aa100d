"""A node that left the job: where a node of a job submitted with `--no-kill` fails, SLURM
keeps the job on the nodes left and kills the step's tasks there, but srun waits on for the
tasks of the node that is gone, and only the job's record (scontrol) says that it is gone.

`NodeWatch` asks for the job's nodes once srun said that a task ended, and ends srun where a
node left; the step is then started again on the nodes left (cluster/allocation.py). Where
Slurm ends the job for the node instead, `after_node_failure` says so, and continues a job
that may not requeue in a new one. No TensorFlow here.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from hostlist import collect_hostlist

from tfconfig_slurm.cluster.allocation import Allocation
from tfconfig_slurm.cluster.step import SlurmJob, expand_nodes
from tfconfig_slurm.errors import SlurmEnvironmentError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import continuation


def nodes_now(job: SlurmJob) -> tuple[str, ...] | None:
    """The nodes `job` holds now, as slurmctld says; None where it cannot say."""
    record = continuation.job_record(job.name)
    return None if isinstance(record, str) else _expanded(record.get("NodeList", "")) or None


def gone(held: Sequence[str], now: Sequence[str] | None) -> tuple[str, ...]:
    """The nodes of `held` that the job no longer holds."""
    return () if now is None else tuple(node for node in held if node not in set(now))


class NodeWatch:
    """Watches the nodes of `job` while `srun` runs a step on `held`, once `noticed()` says
    that srun reported a task's end; ends srun where a node left the job. `left` then names
    the nodes that are gone."""

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
        while self._srun.poll() is None:
            left = gone(self._held, nodes_now(self._job))
            if left and self._srun.poll() is None:
                self.left = left
                # srun would wait for the tasks of the node that is gone: SLURM has already
                # killed the step's tasks on the nodes left.
                self._srun.kill()
                return
            try:
                self._srun.wait(timing.NODE_WATCH_SECONDS)
            except subprocess.TimeoutExpired:
                continue


def after_node_failure(
    model_dir: Path, job: SlurmJob, held: Allocation, environ: Mapping[str, str], most: int
) -> str:
    """Where a node of `job` failed and Slurm ends the job for it (no --no-kill): the line that
    says what becomes of the run, "" where no node failed. Slurm requeues a job that may
    requeue; one that may not (Requeue=0) goes on in a new job, its batch script submitted
    again to start after this one, on as many nodes, without the one that failed; at most
    `most` times (--max_restarts), counted as the run's continuations."""
    record = continuation.job_record(job.name)
    if isinstance(record, str):
        return ""
    left = gone(held.nodes, _expanded(record.get("NodeList", "")))
    if not left:
        return ""
    failed = f"{collect_hostlist(list(left))} failed, and Slurm ends job {job.name}"
    if record.get("Requeue") != "0":
        return f"{failed} and requeues it: the run resumes from its latest checkpoint then"
    refused = f"{failed} and may not requeue it (Requeue=0)"
    if job.continuation >= most:
        return f"{refused}; the run went on in {most} new job(s) already (--max_restarts): it ends"
    try:
        new = continuation.submit(job, model_dir, environ, _without(record, held, left))
    except continuation.ContinuationError as error:
        return f"{refused}, and the run cannot go on in a new job: {error}"
    return (
        f"{refused}: the run goes on in job {new}, submitted to start once this one has ended, "
        f"on {len(held.nodes)} nodes without {collect_hostlist(list(left))}, from its latest "
        "checkpoint"
    )


def _without(record: Mapping[str, str], held: Allocation, left: Sequence[str]) -> dict[str, str]:
    """`record`, asking for the nodes the job had (its record counts those left), never those
    that `left` it: a list of nodes asked for that names one is dropped."""
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

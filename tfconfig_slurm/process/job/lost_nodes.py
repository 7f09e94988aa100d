"""A node that left the job: where a node of a job submitted with `--no-kill` fails, SLURM
keeps the job on the nodes left and kills the step's tasks there, but srun waits on for the
tasks of the node that is gone, and only the job's record (scontrol) says that it is gone.

`NodeWatch` asks for the job's nodes once srun said that a task ended, and ends srun where a
node left; the step is then started again on the nodes left (cluster/allocation.py). No
TensorFlow here.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence

from tfconfig_slurm.cluster.step import SlurmJob, expand_nodes
from tfconfig_slurm.errors import SlurmEnvironmentError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import continuation


def nodes_now(job: SlurmJob) -> tuple[str, ...] | None:
    """The nodes `job` holds now, as slurmctld says; None where it cannot say."""
    record = continuation.job_record(job.name)
    if isinstance(record, str):
        return None
    try:
        listed = record.get("NodeList", "")
        return expand_nodes("scontrol's NodeList", listed, SlurmEnvironmentError, "")
    except SlurmEnvironmentError:
        return None


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

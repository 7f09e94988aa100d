"""A cluster of processes on this machine, for a user without SLURM and for the tests.

`--local_cluster=ps=1,workers=2[,evaluator=1]` (or TFCONFIG_SLURM_LOCAL_CLUSTER for a user's
script; `workers=N` alone for a Keras experiment, which trains all-reduce) starts a chief, the
parameter servers, the workers and an evaluator as processes of the same command (`python -m
tfconfig_slurm.run` with the same flags, or the user's script), each with its TF_CONFIG on free
loopback ports, and holds the model directory for them; writes one log per task
(`<model_dir>/logs/<role>-<index>.log`) and prefixes their lines on the console; waits for all,
and when one fails stops the rest and fails too. Told to stop itself (SIGTERM, SIGINT,
SIGHUP), it passes SIGTERM on to every task, whose trainers stop at the next step with a
checkpoint, and kills what is left after a grace: nothing is left behind, and the tasks die
with a launcher killed outright (children.py). SIGUSR1, SIGUSR2 and SIGQUIT go on to every
task, which acts on them as on its own signal. A task that fails on
bad input (exit 2: every task reads the same flags, so every one fails alike) is reported as
a single process would report it: its one line, once, and exit 2. Imports no TensorFlow: the
parent only supervises.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER
from tfconfig_slurm.cluster.role import LOCAL_RUN_PREFIX, ClusterRole
from tfconfig_slurm.cluster.step import SlurmJob
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process import exits, timing
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import claim, failure
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import children

_COUNTS = {"ps": PS, "workers": WORKER, "evaluator": EVALUATOR}
# More tasks than this a CPU only share it: a cluster that size warns as it starts.
TASKS_PER_CPU = 4


@dataclass(frozen=True)
class LocalTask:
    role: str
    index: int
    address: str


def parse(
    spec: str,
    culprit: str = "--local_cluster",
    *,
    all_reduce: bool = False,
    coordinator: bool = False,
) -> dict[str, int]:
    """`ps=1,workers=2,evaluator=1` as {"ps": 1, "worker": 2, "evaluator": 1}; `culprit`
    names the setting in errors. An all-reduce cluster (a Keras experiment's) has a chief and
    workers only: `workers=1`; a coordinator's (ParameterServerStrategy) a worker at least,
    as the coordinator trains nothing."""
    counts = {PS: 0, WORKER: 0, EVALUATOR: 0}
    hint = f"e.g. {culprit}=workers=1" if all_reduce else f"e.g. {culprit}=ps=1,workers=2"
    given = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = (piece.strip() for piece in item.partition("="))
        if name not in _COUNTS or not (value.isascii() and value.isdigit()) or len(value) > 3:
            raise UsageError(
                culprit,
                f"has {item!r}, expected ps=N, workers=N (N up to 999) or evaluator=0/1",
                hint,
            )
        if name in given:
            raise UsageError(culprit, f"gives {name} twice", hint)
        given.add(name)
        counts[_COUNTS[name]] = int(value)
    if counts[EVALUATOR] > 1:
        raise UsageError(culprit, "asks for more than one evaluator", hint)
    if all_reduce:
        if counts[PS] or counts[EVALUATOR]:
            raise UsageError(
                culprit,
                f"is {spec!r}: a Keras experiment trains all-reduce, with a chief and workers "
                "only, unless a tf-keras one trains with --coordinator (ParameterServerStrategy)",
                hint,
            )
        return counts
    if counts[PS] < 1:
        training = "ParameterServerStrategy" if coordinator else "Estimator training in a cluster"
        raise UsageError(culprit, f"is {spec!r}: {training} needs at least one ps", hint)
    if coordinator and counts[WORKER] < 1:
        raise UsageError(
            culprit,
            f"is {spec!r}: the coordinator trains nothing, so it needs at least one worker",
            hint,
        )
    return counts


def crowding(counts: Mapping[str, int], cpus: int) -> str:
    """A warning for a cluster with more than TASKS_PER_CPU tasks a CPU; "" for one that fits."""
    tasks = 1 + sum(counts.values())
    if tasks <= TASKS_PER_CPU * cpus:
        return ""
    return (
        f"the local cluster has {tasks} tasks for this machine's {cpus} CPUs: each TensorFlow "
        "process takes its share of them and its own memory, so training crawls and a stop "
        "takes long. HINT: fewer workers train faster here; a cluster this size belongs on "
        "SLURM"
    )


def run(
    counts: Mapping[str, int],
    model_dir: Path,
    command: Sequence[str],
    *,
    program: str,
    naming: claim.Naming,
    environ: Mapping[str, str],
    job: SlurmJob | None,
    coordinator: bool = False,
) -> int:
    """Runs the cluster of `command` to the end; the exit status is 0 only if every task's is.
    With `coordinator` it is laid out for ParameterServerStrategy: the chief coordinates.

    `counts` are the tasks by role, as `parse` reads them. The launcher holds the model
    directory for its tasks, which do not claim it; `naming` says how the user names it, in
    the error that another run holds it. `program` starts the one line a
    task writes when it refuses its input (cli.fail). Each task runs in `environ`, with its
    own TF_CONFIG; the launcher holds the directory as a process of the SLURM job `job`.
    """
    crowded = crowding(counts, len(os.sched_getaffinity(0)))
    if crowded:
        logging.warning("%s", crowded)
    held = claim.claim(model_dir, claim.this_holder(job), naming)
    held.renew()
    try:
        return _run(counts, model_dir, command, program, environ, coordinator=coordinator)
    finally:
        held.release()


def _run(
    counts: Mapping[str, int],
    model_dir: Path,
    command: Sequence[str],
    program: str,
    environ: Mapping[str, str],
    *,
    coordinator: bool,
) -> int:
    """Starts the cluster's tasks, supervises them until one fails, all end, or a signal
    stops them all; the exit status a shell would say of it."""
    tasks, every_role = _laid_out(counts, coordinator=coordinator)
    logs = RunDir(model_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    refusals: dict[LocalTask, list[str]] = {task: [] for task in tasks}
    group = children.Group(own_sessions=True)
    started: dict[LocalTask, children.Child] = {}
    copiers: list[threading.Thread] = []
    # Only noted, then acted on by the loops below: a second signal never cuts the stop short.
    stop = preemption.StopRequest()
    told = children.handling(children.STOPPING, lambda number, frame: stop.note_signal(number))
    # The tasks act on a preempt signal themselves (`#SBATCH --signal=USR1@90`, the stop
    # before a time limit, for a cluster run in a SLURM job): passed on, as each task's own.
    passing_on = children.handling(children.PASSED_ON, lambda number, frame: group.signal(number))
    with told, passing_on:
        try:
            for task in tasks:
                if stop.requested:
                    break
                role = replace(every_role, role=task.role, index=task.index)
                started[task], copier = _start(
                    group,
                    task,
                    role,
                    command,
                    logs,
                    refusals=refusals[task],
                    program=program,
                    environ=environ,
                )
                copiers.append(copier)
            failed = _supervise(group, started, stop)
        finally:
            # Every line a task wrote, its last error included, reaches log and console.
            for copier in copiers:
                copier.join()
    return _said_ended(
        started,
        refusals,
        failed=failed,
        first=failure.read(model_dir, every_role.run_id or "") if failed else None,
        stopped_by=stop.signum if failed is None else None,
    )


def _laid_out(
    counts: Mapping[str, int], *, coordinator: bool
) -> tuple[list[LocalTask], ClusterRole]:
    """The cluster's tasks on free ports of this machine (an evaluator's on none), and its
    roles' shared layout (the chief's)."""
    # Free ports, distinct because all are bound at once, then released for the tasks to
    # bind: TensorFlow's gRPC server refuses SO_REUSEPORT, so nothing can hold them meanwhile.
    with ExitStack() as reservations:

        def reserve() -> str:
            holder = reservations.enter_context(socket.socket())
            holder.bind(("127.0.0.1", 0))
            return f"127.0.0.1:{holder.getsockname()[1]}"

        tasks = [LocalTask(CHIEF, 0, reserve())]
        tasks += [LocalTask(PS, index, reserve()) for index in range(counts[PS])]
        tasks += [LocalTask(WORKER, index, reserve()) for index in range(counts[WORKER])]
    cluster: dict[str, tuple[str, ...]] = {}
    for task in tasks:
        cluster[task.role] = (*cluster.get(task.role, ()), task.address)
    # The evaluator is outside the cluster and serves nothing: it needs no port.
    tasks += [LocalTask(EVALUATOR, 0, "-") for _ in range(counts[EVALUATOR])]
    every_role = ClusterRole(
        cluster=cluster,
        role=CHIEF,
        index=0,
        has_evaluator=counts[EVALUATOR] > 0,
        run_id=LOCAL_RUN_PREFIX + uuid.uuid4().hex,
        coordinator=coordinator,
    )
    return tasks, every_role


def _said_ended(
    started: Mapping[LocalTask, children.Child],
    refusals: Mapping[LocalTask, list[str]],
    *,
    failed: LocalTask | None,
    first: failure.Failure | None,
    stopped_by: signal.Signals | None,
) -> int:
    """The cluster's exit status, once its tasks' refusals and its first failure are said: a
    task's refusal alone where it refused its input (exit 2), as a single process would."""
    if failed is not None and refusals[failed] and started[failed].returncode == ExitStatus.REFUSED:
        sys.stderr.write(refusals[failed][0])
        return ExitStatus.REFUSED
    for task, lines in refusals.items():
        sys.stderr.writelines(_prefix(task) + line for line in lines)
    if failed is not None:
        process = started[failed]
        logging.error(
            "%s %d (pid %d) %s; the other tasks were stopped",
            failed.role,
            failed.index,
            process.pid,
            exits.how_it_ended(process.returncode),
        )
        # The task that failed first, as it said, where the last to exit may only be its peer.
        if first is not None:
            logging.error("first to fail: %s", first.line())
    # As a shell reports a process that a signal ended.
    return 128 + stopped_by if stopped_by is not None else int(failed is not None)


def _start(
    group: children.Group,
    task: LocalTask,
    role: ClusterRole,
    command: Sequence[str],
    logs: Path,
    *,
    refusals: list[str],
    program: str,
    environ: Mapping[str, str],
) -> tuple[children.Child, threading.Thread]:
    task_environ = {**environ, "TF_CONFIG": json.dumps(role.tf_config())}
    if task.role in (PS, EVALUATOR):
        task_environ["CUDA_VISIBLE_DEVICES"] = ""
    process = group.start(command, task_environ, capture=True)
    log = (logs / f"{task.role}-{task.index}.log").open("w")
    assert process.stdout is not None
    copier = threading.Thread(
        target=_copy,
        args=(process.stdout, log, _prefix(task), refusals, f"{program}: "),
        daemon=True,
    )
    copier.start()
    logging.info("started %s %d at %s (pid %d)", task.role, task.index, task.address, process.pid)
    return process, copier


def _prefix(task: LocalTask) -> str:
    return f"[{task.role} {task.index}] "


def _copy(
    source: IO[str], log: IO[str], prefix: str, refusals: list[str], refusal_start: str
) -> None:
    """Copies a task's lines to its log and, prefixed, to the console; a refusal of bad input
    is held back for the supervisor, which shows it once for all tasks."""
    with log:
        for line in source:
            log.write(line)
            log.flush()
            if line.startswith(refusal_start):
                refusals.append(line)
            else:
                sys.stderr.write(prefix + line)


def _supervise(
    group: children.Group, tasks: dict[LocalTask, children.Child], stop: preemption.StopRequest
) -> LocalTask | None:
    """Waits for every task, or for the launcher to be told to stop, then stops them all;
    returns the first task that failed, once the others are stopped."""
    running = dict(tasks)
    while running and not stop.requested:
        for task, process in list(running.items()):
            status = process.poll()
            if status is None:
                continue
            del running[task]
            if status != 0:
                group.stop(timing.LOCAL_FAILED_GRACE_SECONDS)
                return task
            logging.info("%s %d finished", task.role, task.index)
        time.sleep(0.1)
    if stop.requested:
        logging.warning(
            "%s: stopping every task; trainers stop at the next step with a checkpoint "
            "(tasks still running in %.0f s are killed)",
            stop.signal_name,
            timing.LOCAL_STOP_GRACE_SECONDS,
        )
        group.stop(timing.LOCAL_STOP_GRACE_SECONDS)
    return None

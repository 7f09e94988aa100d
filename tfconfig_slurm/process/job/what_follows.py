"""What follows the end of a run's step, in the process that sees it: a stopped task's requeue
or continuation (after_stop), the batch script's restart of a failed step (after_failure,
after_node_failure). docs/development.md draws the whole. No TensorFlow here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from absl import logging

from tfconfig_slurm.cluster.step import Allocation, SlurmJob
from tfconfig_slurm.errors import ExitStatus
from tfconfig_slurm.process import slurm_commands
from tfconfig_slurm.process.job import continuation, restarts
from tfconfig_slurm.process.job.preemption import StopPolicy
from tfconfig_slurm.process.records import attempts, failure, history, reports
from tfconfig_slurm.process.records.failure import Failure


def after_stop(
    environ: Mapping[str, str],
    job: SlurmJob | None,
    stopped_on: str,
    policy: StopPolicy,
    model_dir: Path,
) -> ExitStatus:
    """The exit status of a task stopped on a signal, once the job is requeued or not."""
    if stopped_on in policy.requeue_on:
        return requeue(environ, job, policy.max_requeues, stopped_on, model_dir)
    not_requeued = (
        "; not requeueing the job (a --preempt_signal requeues it, and SIGTERM with "
        "--requeue_on_sigterm)"
    )
    logging.info(
        "stopped on %s with a checkpoint of every step taken%s: %s",
        stopped_on,
        "" if job is None else not_requeued,
        _resume(model_dir),
    )
    return ExitStatus.DONE


def _resume(model_dir: Path) -> str:
    # The directory, not the experiment id: a script's user (the Python API) names none.
    return f"run again with the same model directory, {model_dir}, to resume"


def requeue(
    environ: Mapping[str, str],
    job: SlurmJob | None,
    max_requeues: int,
    stopped_on: str,
    model_dir: Path,
) -> ExitStatus:
    """Requeues `job`, or submits it again where SLURM refuses; this task's exit status."""
    if job is None:
        logging.warning(
            "stopped on %s outside a SLURM job: nothing to requeue; %s",
            stopped_on,
            _resume(model_dir),
        )
        return ExitStatus.DONE
    target, restarts = job.name, attempts.requeued(job)
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
        return ExitStatus.NOT_REQUEUED
    problem = slurm_commands.requeue(target)
    if not problem:
        logging.info(
            "stopped on %s; requeued job %s (requeue %d of at most %d): it resumes from the "
            "checkpoint",
            stopped_on,
            target,
            restarts + 1,
            max_requeues,
        )
        return ExitStatus.DONE
    return _requeue_refused(
        job, problem, environ=environ, restarts=restarts, max_requeues=max_requeues,
        stopped_on=stopped_on, model_dir=model_dir,
    )  # fmt: skip


def _requeue_refused(
    job: SlurmJob,
    problem: str,
    *,
    environ: Mapping[str, str],
    restarts: int,
    max_requeues: int,
    stopped_on: str,
    model_dir: Path,
) -> ExitStatus:
    """This task's exit status after `scontrol requeue` failed, the run requeued or continued
    `restarts` times before. Only a job that may not requeue goes on in a new one: a failed
    requeue may have been done, or be SLURM's to do."""
    target = job.name
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
        return ExitStatus.DONE
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
            return ExitStatus.DONE
    logging.error(
        "stopped on %s, but `scontrol requeue %s` failed (%s), and %s. HINT: submit the job "
        "again with the same experiment id to resume from the checkpoint",
        stopped_on,
        target,
        problem,
        why,
    )
    return ExitStatus.NOT_REQUEUED


def after_failure(
    model_dir: Path,
    job: SlurmJob,
    step: restarts.Step,
    *,
    done: int,
    most: int,
    who: str,
    left: Sequence[str] = (),
) -> tuple[str, str | None]:
    """The line that says whether the step starts again (`done` restarts of at most `most`),
    and the restart's cause where it does; ("", None) where the job makes none. Where nodes
    `left` the job (--no-kill), it starts again on those left, whatever its tasks said."""
    if most <= 0:
        return "", None
    if left:
        judged = restarts.Verdict(
            again=True,
            why=f"{restarts.nodes_named(left)} left the job: its node failed, and the job "
            "(--no-kill) goes on with the nodes left",
        )
    else:
        # Whether the step trained at all: progress.json changed, or (a script of the user's
        # keeps none) a later checkpoint was written; not by the times (two nodes' clocks).
        trained = (
            done == 0
            or restarts.progress_mark(model_dir) not in ({}, step.progress_at_start)
            or (history.checkpoint_step(model_dir) or 0) > (step.checkpoint_at_start or 0)
        )
        judged = restarts.verdict(step.first, step.srun_said, trained=trained)
        judged = _not_hung_again(model_dir, job, step.first, judged)
    if not judged.again:
        return f"{who}: not starting the step again: {judged.why}", None
    if done >= most:
        return (
            f"{who}: not starting the step again: {judged.why}, and the job made its {most} "
            "restart(s) (--max_restarts)"
        ), None
    step_now = history.checkpoint_step(model_dir)
    # A script of the user's may keep its checkpoints elsewhere (BackupAndRestore's folder).
    resumed = "with no checkpoint in its model directory"
    if step_now is not None:
        resumed = f"from the checkpoint of step {step_now}"
    where = " on the nodes left" if left else ""
    return (
        f"{who}: starting the step again in job {job.name}{where} (restart {done + 1} of at "
        f"most {most}), {resumed}: {judged.why}"
    ), judged.why


def _not_hung_again(
    model_dir: Path, job: SlurmJob, first: Failure | None, judged: restarts.Verdict
) -> restarts.Verdict:
    """No restart for a step that hung where an earlier one hung and was restarted for."""
    hung_at = first.hung_at() if first is not None else None
    if hung_at is None:
        return judged
    causes = attempts.causes_in_job(reports.read_state(model_dir), job.name)
    if any(cause.endswith(f"{failure.HUNG}{hung_at}") for cause in causes):
        return restarts.Verdict(
            again=False,
            why=f"{judged.why} again, as before its last restart: the run's own code or data "
            "hangs there",
        )
    return judged


def after_node_failure(
    model_dir: Path, job: SlurmJob, held: Allocation, environ: Mapping[str, str], most: int
) -> str:
    """The line that says what becomes of the run where Slurm ends `job` for a failed node
    ("" where none is known to have): one that may not requeue goes on without the node."""
    record = continuation.job_record(job.name)
    # A job ending lists fewer nodes as each completes: only those Slurm says failed are.
    left = restarts.down(restarts.gone(held.nodes, restarts.nodes_of(record)))
    if isinstance(record, str) or not left:
        return ""
    nodes = restarts.nodes_named(left)
    failed = f"{nodes} failed, and Slurm ends job {job.name}"
    if record.get("Requeue") != "0":
        return f"{failed} and requeues it: the run resumes from its latest checkpoint then"
    refused = f"{failed} and may not requeue it (Requeue=0)"
    earlier = continuation.read(model_dir)
    if earlier is not None and earlier.after == job.name:
        # Its stop went on in a new job already (the runtime's, on SIGTERM).
        return f"{refused}: the run goes on in job {earlier.job_id}"
    done = attempts.continued_for_nodes(model_dir)
    if done >= most:
        return (
            f"{refused}; the run went on in a new job for a failed node {done} time(s) already, "
            f"of at most {most} (--max_restarts): it ends"
        )
    try:
        new = continuation.submit(job, model_dir, environ, restarts.without(record, held, left))
    except continuation.ContinuationError as error:
        return f"{refused}, and the run cannot go on in a new job: {error}"
    attempts.record(model_dir, job, f"{nodes} failed", continued_in=new)
    return (
        f"{refused}: the run goes on in job {new}, submitted to start once this one has ended, "
        f"on {len(held.nodes)} nodes without {nodes}, from its latest checkpoint"
    )

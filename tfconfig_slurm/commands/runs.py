"""Every run under an output root, one line each: its state, step, final metrics, speed,
hparams, SLURM job and last update.

  tfconfig-slurm runs [OUTPUT_ROOT] [--sort METRIC] [--json]
  tfconfig-slurm runs --run=MODEL_DIR     # one run's standing in one line, as a job's .out ends

OUTPUT_ROOT defaults to $TFCONFIG_SLURM_OUTPUT, else ./tf-output. A run's state comes from
what it wrote (state.json, summary.json) and, where squeue is there, from SLURM: running; done;
failed (a run that ended without saying so: killed, its node lost, or an error); stopped (on a
signal, with a checkpoint; it resumes when run again); requeued (stopped, and its job waits in
the queue to resume); continued (stopped, and the job it goes on in waits: JOB shows `31 ->
35`); refused (no run began: a batch job was refused at its start, and why is said under
the table, as for a job refused where a run is); unreadable (its
state.json or summary.json is not what the runtime writes). Beside
the state, why: the time limit or the signal that stopped a run, and, for a few
minutes after its job ended, SLURM's word where the run could not say (cancelled, node
failure, out of memory). --sort orders by a final metric, best first (the lowest for a loss or
an error, else the highest). Imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import flags

from tfconfig_slurm.cluster.step import read_slurm_job
from tfconfig_slurm.commands import cli, json_flag
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import continuation
from tfconfig_slurm.process.records import (
    attempts,
    claim,
    failure,
    history,
    reports,
    run_dir,
)
from tfconfig_slurm.process.records.reports import RunState

PROGRAM = "tfconfig-slurm runs"

SORT = flags.DEFINE_string(
    "sort", None, "Order the runs by this final metric, best first, e.g. accuracy or loss."
)
RUN = flags.DEFINE_string(
    "run",
    None,
    "Say in one line how the run in this model directory stands, as a batch script's .out "
    "ends: done at its step with its metrics, stopped and requeued (or going on in a new "
    "job), or failed with its first failure; and where its summary and logs are.",
)
SETTLE = flags.DEFINE_float(
    "settle",
    0.0,
    "With --run: wait up to this many seconds while the run still says it is running (a "
    "requeue ends a batch script before the run's chief has said that it stopped).",
    lower_bound=0.0,
)
flags.adopt_module_key_flags(json_flag)
cli.refuse_empty(SORT, RUN)
# A job that squeue lists in these states has not started its run (again) yet.
_WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING"}
# How SLURM says a job ended that the run cannot say itself (squeue lists ended jobs for
# MinJobAge, 300 s by default); other ended states say nothing more than the run's own.
_ENDED = {
    "CANCELLED": "cancelled",
    "NODE_FAIL": "node failure",
    "BOOT_FAIL": "node failure",
    "OUT_OF_MEMORY": "out of memory",
    "TIMEOUT": "time limit",
    "DEADLINE": "deadline",
    "PREEMPTED": "preempted",
}
_GONE = {*_ENDED, "COMPLETED", "FAILED", "SPECIAL_EXIT"}
# The state --run gives its own batch job, whose step is over as it asks (squeue may still
# say RUNNING): a requeue shows only in its record's restarts.
_ENDING = "ENDING"


def main(argv: Sequence[str]) -> int:
    if len(argv) > 2:
        raise UsageError(repr(argv[2]), "is one word too many", f"{PROGRAM} [OUTPUT_ROOT]")
    if RUN.value is None and SETTLE.present:
        raise UsageError("--settle", "goes with --run", f"{PROGRAM} --run=MODEL_DIR --settle=20")
    if RUN.value is not None:
        sys.stdout.write(_standing(Path(RUN.value), argv) + "\n")
        return 0
    root = Path(argv[1] if len(argv) > 1 else run_dir.output_root(os.environ))
    hint = f"give the runs' --output_root: {PROGRAM} OUTPUT_ROOT (or set TFCONFIG_SLURM_OUTPUT)"
    culprit = (
        "OUTPUT_ROOT"
        if len(argv) > 1 or not os.environ.get(run_dir.OUTPUT_ROOT_VARIABLE)
        else run_dir.OUTPUT_ROOT_VARIABLE
    )
    try:
        folders = sorted(Path(entry.path) for entry in os.scandir(root) if entry.is_dir())
    except NotADirectoryError:
        raise UsageError(culprit, f"{str(root)!r} is not a directory", hint) from None
    except FileNotFoundError:
        raise UsageError(culprit, f"{str(root)!r} does not exist", hint) from None
    except PermissionError:
        raise UsageError(culprit, f"{str(root)!r} may not be read by this user", hint) from None
    jobs = _queued_jobs()
    runs = [run for run in (_readable_run(folder, jobs) for folder in folders) if run]
    if not runs:
        # On stderr, beside the empty table: given a run's own directory, its output root.
        hint = ""
        if _run(root, None) is not None:
            hint = f" HINT: {root} is a run; its output root lists it: {PROGRAM} {root.parent}"
        sys.stderr.write(f"{PROGRAM}: no runs in {root}.{hint}\n")
    if metric := SORT.value:
        known = {name for run in runs for name in run["eval"]}
        if runs and metric not in known:
            raise UsageError(
                "--sort",
                f"is {metric!r}, which no finished run reports",
                f"the runs' final metrics are: {', '.join(sorted(known)) or 'none yet'}",
            )
        with_metric = [run for run in runs if metric in run["eval"]]
        lower_is_better = "loss" in metric or "error" in metric
        with_metric.sort(key=lambda run: run["eval"][metric], reverse=not lower_is_better)
        runs = with_metric + [run for run in runs if metric not in run["eval"]]
    if json_flag.JSON.value:
        sys.stdout.write(json.dumps(runs, indent=1) + "\n")
    else:
        sys.stdout.write(_table(runs))
    return 0


def _standing(folder: Path, argv: Sequence[str]) -> str:
    """--run's line: how the run in `folder` stands."""
    for holder in (SORT, json_flag.JSON):
        if holder.present:
            raise UsageError(
                f"--{holder.name}",
                "goes with the table of runs, not --run's one line",
                f"leave --run out: {PROGRAM} OUTPUT_ROOT --{holder.name}",
            )
    if len(argv) > 1:
        raise UsageError(repr(argv[1]), "is one word too many with --run", f"{PROGRAM} --run=DIR")
    # A local file, read once a second: squeue and scontrol are asked once, after.
    timing.poll(
        lambda: reports.read_state(folder).get("state"),
        lambda state: state != RunState.RUNNING,
        SETTLE.value,
        every=1.0,
    )
    # This process's job as squeue names it (an array task as 41_3); "" outside SLURM.
    job = read_slurm_job(os.environ)
    jobs, own = _queued_jobs(), job.name if job else ""
    if jobs is not None and own in jobs:
        # Asked by a batch script once its step is over: its own job is ending.
        jobs[own] = _ENDING
    if not folder.is_dir():
        raise UsageError(
            "--run",
            f"is {str(folder)!r}, which is no directory",
            f"give a run's model directory, as `{PROGRAM}` lists them under their output root",
        )
    run = _readable_run(folder, jobs)
    paths = run_dir.RunDir(folder)
    if run is None:
        _refuse_an_output_root(folder, paths)
        # A batch job refused before it could say why here (its first lines say it).
        return f"{folder}: no run has started here, nothing was trained{_logs(paths)}"
    if run["state"] == _REFUSED or (run["refused"] and run["refused"]["job_id"] == own):
        return (
            f"{folder}: job {run['refused']['job_id']} was refused at its start, nothing was "
            f"trained: {run['refused']['line']}{_logs(paths)}"
        )
    if run["state"] == _UNREADABLE:
        return (
            f"{folder}: {_UNREADABLE}: its state.json or summary.json is not what the runtime "
            "writes"
        )
    return f"{folder}: {_how_it_stands(folder, run, paths)}{_logs(paths)}"


def _refuse_an_output_root(folder: Path, paths: run_dir.RunDir) -> None:
    """--run given an output root of runs, not a run, is refused: its runs named."""
    # A sweep's runs are a level deeper in its output root.
    held = [
        str(each.parent.relative_to(folder))
        for pattern in (f"*/{paths.state.name}", f"*/*/{paths.state.name}")
        for each in sorted(folder.glob(pattern))
    ]
    if held:
        raise UsageError(
            "--run",
            f"is {str(folder)!r}, an output root of {len(held)} run(s) ({', '.join(held[:3])}"
            f"{', ...' if len(held) > 3 else ''}), not a run's model directory",
            f"give one of them, e.g. --run={folder / held[0]}, or list those of its output "
            f"root: {PROGRAM} {(folder / held[0]).parent}",
        )


def _how_it_stands(folder: Path, run: Mapping[str, Any], paths: run_dir.RunDir) -> str:
    """How the run `run` of `folder` ended, or where it is."""
    step, state = run["global_step"], run["state"]
    # How far a failed run got is lost with it: what is kept is its latest checkpoint.
    checkpoint = history.checkpoint_step(folder)
    kept = (
        "no checkpoint" if checkpoint is None else f"its latest checkpoint is at step {checkpoint}"
    )
    why = f" ({_stopped_by(run)})" if _stopped_by(run) else ""
    # A command under with-tfconfig may save no checkpoint and write no summary.json.
    at = f" at step {step}" if step is not None else ""
    resumes = " from the checkpoint" if checkpoint is not None else ""
    said = {
        "done": f"done{at or f' ({kept})'}"
        + (f": {_pairs(_shown(run['eval']), 4)}" if _shown(run["eval"]) else "")
        + (f"; summary in {paths.summary}" if paths.summary.is_file() else ""),
        "requeued": f"stopped{at}{why} and requeued: job {run['job_id']} resumes it{resumes}",
        "continued": f"stopped{at}{why}; it goes on in job {run['continued_as']}{resumes}",
        "stopped": f"stopped{at}{why} with "
        + (
            "a checkpoint; run it again with the same experiment id to resume"
            if checkpoint is not None
            else "no checkpoint"
        ),
        "failed": f"failed ({kept}); first to fail: {run['first_failure'] or 'not recorded'}",
    }.get(state, f"{state}{at}")
    restarted = f"; {_restarted(run)}" if run["restarts"] else ""
    return f"{said}{restarted}"


def _logs(paths: run_dir.RunDir) -> str:
    """Where the run's task logs are, where a batch script or a local cluster wrote them."""
    return f"; task logs in {paths.logs}" if paths.logs.is_dir() else ""


def _readable_run(folder: Path, jobs: Mapping[str, str] | None) -> dict[str, Any] | None:
    """A run's line, or one that says its files cannot be read (state.json or summary.json
    edited, cut short or of another program), rather than a traceback or no line at all."""
    paths = run_dir.RunDir(folder)
    try:
        # Only a run's: another program's summary.json in a folder of its own is no run.
        if paths.state.exists() and _damaged(paths):
            raise ValueError("state.json or summary.json holds no JSON object")
        run = _run(folder, jobs)
        if run is not None:
            _table([run])  # what its line shows is of the types it expects
            if not isinstance(run["global_step"], (int, type(None))):
                raise TypeError("a step is a whole number")
            return run
    except (AttributeError, TypeError, ValueError, LookupError):
        pass
    else:
        if not paths.state.exists():
            return None
    return _line(folder, _UNREADABLE)


def _line(folder: Path, state: str, **given: Any) -> dict[str, Any]:
    """A line no run's records fill: an unreadable run's, or a job's refused at its start."""
    return {
        "experiment_id": folder.name,
        "state": state,
        **dict.fromkeys(("global_step", "examples_per_sec", "job_id", "continued_as")),
        **dict.fromkeys(("first_failure", "stopped_by", "ended_by", "updated", "refused")),
        "restarts": [],
        "eval": {},
        "hparams": {},
        **given,
    }


def _damaged(paths: run_dir.RunDir) -> bool:
    """Whether state.json or summary.json is there but holds no JSON object (the runtime
    writes each whole, by an atomic rename), which read as none would show a run done."""
    for path in (paths.state, paths.summary):
        try:
            value = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return True
        if not isinstance(value, dict):
            return True
    return False


def _run(folder: Path, jobs: Mapping[str, str] | None) -> dict[str, Any] | None:
    """A run's line of the table; None for a folder that holds no run."""
    paths = run_dir.RunDir(folder)
    state = reports.read_state(folder)
    summary = reports.read_summary(folder)
    step = history.checkpoint_step(folder)
    # The attempt's own record, which a task that failed at once may have written before the
    # attempt's start was: else the newest, if it came since.
    this_run = failure.read(folder, str(state["run"])) if state.get("run") else None
    first = this_run or failure.latest(folder)
    refused = attempts.read_refusal(folder)
    if not state and not paths.checkpoint_index.exists():
        # A task refused at its start records that as the run's failure too (its peers would
        # record it lost): the job was refused, as its refusal says.
        if refused is not None and (
            first is None or (first.exit_status == ExitStatus.REFUSED and first.seen_by is None)
        ):
            return _line(
                folder,
                _REFUSED,
                job_id=refused.job_id,
                updated=refused.time,
                refused=refused._asdict(),
            )
        if first is None:
            return None
    # A trainer that took no step (a resume with nothing left to train) has no speed to add.
    speeds = [
        speed
        for trainer in summary.get("trainers", ())
        if (speed := trainer.get("examples_per_sec"))
    ]
    continued = _continued(folder, state)
    failed_line = _first_failure(first, state, this_run=this_run is not None)
    said = _state(folder, state, summary, jobs, failed=failed_line is not None, continued=continued)
    slurm_said = _ENDED.get((jobs or {}).get(str(state.get("job_id")), ""))
    kept = step if step is not None else state.get("global_step")
    logged = _logged_step(paths, state) if said == "running" else None
    return {
        "experiment_id": folder.name,
        "state": said,
        "global_step": kept if logged is None else logged,
        "eval": summary.get("eval", {})
        if state.get("state", RunState.DONE) == RunState.DONE
        else {},
        "examples_per_sec": round(sum(speeds), 1) if speeds else None,
        "hparams": state.get("hparams", {}),
        "job_id": state.get("job_id"),
        "continued_as": continued.job_id if continued else None,
        "first_failure": failed_line if said == "failed" else None,
        "restarts": attempts.causes_in_job(state, str(state.get("job_id"))),
        "stopped_by": state.get("why", state.get("signal"))
        if said in ("stopped", "requeued", "continued")
        else None,
        "ended_by": slurm_said if said in ("stopped", "failed") else None,
        "updated": _updated(paths),
        "refused": _refused_since(refused, state),
    }


def _updated(paths: run_dir.RunDir) -> float | None:
    """When the run last wrote a record (progress.json moves between checkpoints); None
    where it wrote none."""
    times = []
    for path in (paths.state, paths.summary, paths.checkpoint_index, paths.progress):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times, default=0.0) or None


def _refused_since(
    refused: attempts.Refusal | None, state: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A job refused at its start since the run's last attempt began."""
    if refused is None or refused.time <= _last_attempt_started(state):
        return None
    return dict(refused._asdict())


_REFUSED = "refused"
_UNREADABLE = "unreadable"


def _logged_step(paths: run_dir.RunDir, state: Mapping[str, Any]) -> int | None:
    """The global step a running run's owner last logged in this attempt, if it did."""
    progress = reports.read_json(paths.progress)
    step = progress.get("global_step")
    if not isinstance(step, int) or progress.get("time", 0.0) < _last_attempt_started(state):
        return None
    return step


def _last_attempt_started(state: Mapping[str, Any]) -> float:
    return float(reports.last_attempt(state).get("started", 0.0))


def _state(
    folder: Path,
    state: Mapping[str, Any],
    summary: Mapping[str, Any],
    jobs: Mapping[str, str] | None,
    *,
    failed: bool,
    continued: continuation.Continued | None,
) -> str:
    # A run a script trained itself (with-tfconfig --model_dir) may say only that it failed.
    said = state.get("state", "done" if summary else "failed" if failed else "unknown")
    job = state.get("job_id")
    if said == RunState.STOPPED and continued is not None:
        job = continued.job_id
    queued = None if jobs is None or job is None else jobs.get(str(job))
    if queued in _GONE:
        queued = None
    if said == RunState.STOPPED:
        if queued is None:
            return "stopped"
        if queued in _WAITING or (continued is None and _requeued_since(state)):
            return "requeued" if continued is None else "continued"
        return "stopped" if queued == _ENDING else "running"
    if said != RunState.RUNNING:
        return str(said)
    if job is not None and jobs is not None:
        # A run still "running" whose job is over, or ending, ended without saying so.
        return "running" if queued not in (None, _ENDING) else "failed"
    # Outside SLURM, or without squeue: every run holds the model directory's lock from
    # before it says "running" until it says how it ended; none, or a stale one, and the run
    # ended without a word.
    return "running" if claim.held_by_live_run(folder) else "failed"


def _requeued_since(state: Mapping[str, Any]) -> bool:
    """Whether a stopped run's job was requeued since its attempt started, though squeue does
    not list it waiting yet (COMPLETING, as its batch script's last line is said)."""
    restart = str(state.get("run") or "").rpartition(".")[2]
    if not restart.isdigit():
        return False
    record = continuation.job_record(str(state.get("job_id")))
    return isinstance(record, dict) and continuation.requeued(record, int(restart))


def _continued(folder: Path, state: Mapping[str, Any]) -> continuation.Continued | None:
    """The job the run went on in, if it did since its last attempt started."""
    continued = continuation.read(folder)
    if continued is None or continued.time < _last_attempt_started(state):
        return None
    return continued


def _first_failure(
    first: failure.Failure | None, state: Mapping[str, Any], *, this_run: bool
) -> str | None:
    """The line of `first` (the attempt's own record, `this_run`, or a newer failure); else
    the error the run's owner said it failed with (a single process records none)."""
    if first is None or (not this_run and first.time < _last_attempt_started(state)):
        error = state.get("error") if state.get("state") == RunState.FAILED else None
        return str(error) if error else None
    return first.line()


def _queued_jobs() -> dict[str, str] | None:
    """Every job squeue lists (array tasks one by one, as 123_4), those that ended lately
    too, and its state; None without squeue."""
    listed = claim.squeue("--array", "--states=all", "--format=%i %T")
    if listed is None or listed.returncode != 0:
        return None
    return dict(line.split(maxsplit=1) for line in listed.stdout.splitlines() if " " in line)


def _table(runs: list[dict[str, Any]]) -> str:
    header = ("EXPERIMENT_ID", "STATE", "STEP", "EVAL", "EXAMPLES/S", "HPARAMS", "JOB", "UPDATED")
    rows = [header]
    for run in runs:
        # What stopped or ended a run, and its restarts: (time limit; restarted 1x in ...).
        why = "; ".join(each for each in (_stopped_by(run), _restarted(run)) if each)
        rows.append(
            (
                run["experiment_id"],
                run["state"] + (f" ({why})" if why else ""),
                "-" if run["global_step"] is None else str(run["global_step"]),
                _pairs(_shown(run["eval"]), 4) or "-",
                "-" if run["examples_per_sec"] is None else f"{run['examples_per_sec']:.0f}",
                _pairs(run["hparams"], 6) or "-",
                (run["job_id"] or "-")
                + (f" -> {run['continued_as']}" if run["continued_as"] else ""),
                "-" if run["updated"] is None else _ago(run["updated"]),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]
    # Too long for a column: each failed run's first failure, under the table.
    lines += [
        f"{run['experiment_id']}: first to fail: {run['first_failure']}"
        for run in runs
        if run["first_failure"]
    ]
    lines += [
        f"{run['experiment_id']}: job {run['refused']['job_id']} was refused at its start: "
        f"{run['refused']['line']}"
        for run in runs
        if run["refused"]
    ]
    return "\n".join(lines) + "\n"


# The final metrics the table and --run show, those of them a run has, in this order; a run
# with none of them shows its first few (4) by name. --json has them all.
_MAIN_METRICS = ("accuracy", "loss", "auc", "average_loss", "precision", "recall")


def _shown(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The few final metrics that matter (a DNNClassifier reports 11): the table's EVAL."""
    names = [name for name in _MAIN_METRICS if name in metrics] or sorted(
        name for name in metrics if name != "global_step"
    )
    return {name: metrics[name] for name in names[:4]}


def _stopped_by(run: Mapping[str, Any]) -> str:
    return str(run["ended_by"] or run["stopped_by"] or "")


def _restarted(run: Mapping[str, Any]) -> str:
    """`restarted 1x in its job: worker 0 stopped answering` (the latest cause), or ""."""
    restarts = run["restarts"]
    return f"restarted {len(restarts)}x in its job: {restarts[-1]}" if restarts else ""


def _pairs(values: Mapping[str, Any], digits: int) -> str:
    return ",".join(
        f"{name}={value:.{digits}g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in sorted(values.items())
    )


def _ago(when: float) -> str:
    seconds = max(0, int(time.time() - when))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def run() -> None:
    run_cli(PROGRAM, main, arguments=True)


if __name__ == "__main__":
    run()

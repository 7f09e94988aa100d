"""What a run leaves in its model directory besides checkpoints: state.json, each trainer's
report and the evaluator's final metrics, and the chief's summary.json made from them.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR
from tfconfig_slurm.cluster.role import ClusterRole, TaskId
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.records import failure, files
from tfconfig_slurm.process.records.run_dir import RunDir

_EVALUATOR = str(TaskId(EVALUATOR, 0))


def marker(role: ClusterRole, train_steps: int) -> dict[str, Any]:
    """What a task's reports carry, so that the chief never takes an earlier run's: the run id,
    and the step it trains to (all there is with a TF_CONFIG made elsewhere)."""
    return {"run": role.run_id, "train_steps": train_steps}


def _of_run(report: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    return all(report.get(key) == value for key, value in run.items())


def write_trainer_report(
    model_dir: Path, role: ClusterRole, run: Mapping[str, Any], examples_per_sec: float | None
) -> None:
    run_dir = RunDir(model_dir)
    run_dir.trainer_reports.mkdir(exist_ok=True)
    report = {"role": role.role, "index": role.index, "examples_per_sec": examples_per_sec, **run}
    write_json_atomically(run_dir.trainer_report(role.task_id), report)


def trainer_reports(model_dir: Path, trainers: int, run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every trainer's report of this run, waiting a while for the ones not yet written."""
    folder = RunDir(model_dir).trainer_reports

    def current() -> list[dict[str, Any]]:
        reports = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
        return [report for report in reports if _of_run(report, run)]

    found = timing.poll(
        current, lambda reports: len(reports) >= trainers, timing.REPORT_WAIT_SECONDS
    )
    if len(found) < trainers:
        # Seen: a script's tasks that each made a model directory of their own.
        logging.warning(
            "%d of the %d trainers reported their throughput into %s within %.0f s: the "
            "summary counts only theirs. HINT: give every task the same model directory, on a "
            "file system that every node shares",
            len(found),
            trainers,
            folder,
            timing.REPORT_WAIT_SECONDS,
        )
    return found


def write_evaluator_result(
    model_dir: Path, run: Mapping[str, Any], metrics: Mapping[str, Any]
) -> None:
    result = {name: float(value) for name, value in metrics.items()}
    write_json_atomically(RunDir(model_dir).evaluator_result, {**run, "metrics": result})


def write_evaluator_gave_up(model_dir: Path, run: Mapping[str, Any], why: str) -> None:
    """The evaluator could not evaluate the final checkpoint (`why`): the chief does."""
    write_json_atomically(RunDir(model_dir).evaluator_result, {**run, "gave_up": why})


def evaluator_result(model_dir: Path, run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The metrics this run's evaluator wrote of the first checkpoint at or past the final step;
    None, said why, where it gave up, failed or took too long."""
    path = RunDir(model_dir).evaluator_result

    def result() -> dict[str, Any] | str | None:
        if path.exists():
            said = json.loads(path.read_text())
            if _of_run(said, run):
                return said.get("metrics") or f"it gave up: {said.get('gave_up')}"
        first = failure.read(model_dir, run["run"]) if run.get("run") else None
        return f"it failed: {first.line()}" if first and first.task == _EVALUATOR else None

    final = timing.poll(result, lambda value: value is not None, timing.EVALUATOR_WAIT_SECONDS)
    if isinstance(final, dict):
        return final
    logging.warning(
        "the evaluator gave no result for step %d (%s); evaluating the final checkpoint here",
        run["train_steps"],
        final or f"none within {timing.EVALUATOR_WAIT_SECONDS:.0f} s",
    )
    return None


def say_evaluating(step: int, eval_steps: int | None) -> None:
    """The line before a Keras run's final evaluation, where an endless eval set waits."""
    logging.info(
        "evaluating the model of step %d on %s",
        step,
        "the whole eval set" if eval_steps is None else f"{eval_steps} batches of the eval set",
    )


def metric_text(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {float(value):.4g}" for name, value in sorted(metrics.items()))


def report_trained(
    model_dir: Path,
    *,
    name: str,
    role: ClusterRole | None,
    train_steps: int,
    mean_examples_per_sec: float | None,
    metrics: Mapping[str, Any],
    started: float,
    write_eval: Callable[[Path, Mapping[str, Any], int], None],
) -> None:
    """A Keras trainer that trained and evaluated: its report; and for the run's owner, once every
    trainer's is in, the evaluation for TensorBoard (`write_eval`) and summary.json."""
    if role is not None:
        run_marker = marker(role, train_steps)
        write_trainer_report(model_dir, role, run_marker, mean_examples_per_sec)
        if role.role != CHIEF:
            return
        trainers = trainer_reports(model_dir, role.trainers, run_marker)
    else:
        trainers = [{"role": CHIEF, "index": 0, "examples_per_sec": mean_examples_per_sec}]
    write_eval(model_dir, metrics, int(metrics["global_step"]))
    write_summary(
        model_dir,
        name=name,
        metrics=metrics,
        wall_time_s=time.monotonic() - started,
        trainers=trainers,
        layout=role.jobs() if role is not None else "single process",
    )


def write_summary(
    model_dir: Path,
    *,
    name: str,
    metrics: Mapping[str, Any],
    wall_time_s: float,
    trainers: list[dict[str, Any]],
    layout: Any,
) -> dict[str, Any]:
    """Writes summary.json and says where the run's results are; returns what it wrote."""
    earlier = read_summary(model_dir)
    took = f"in {wall_time_s:.1f} s"
    if earlier.get("global_step") == int(metrics["global_step"]) and not any(
        trainer.get("examples_per_sec") for trainer in trainers
    ):
        # Nothing trained here (a rerun, only evaluated): the training's figures stand.
        took = f"(evaluated again in {wall_time_s:.1f} s)"
        trainers = earlier.get("trainers", trainers)
        wall_time_s = earlier.get("wall_time_s", wall_time_s)
    summary = {
        "experiment": name,
        "global_step": int(metrics["global_step"]),
        "wall_time_s": round(wall_time_s, 3),
        "trainers": trainers,
        "eval": {key: float(value) for key, value in metrics.items()},
        "layout": layout,
    }
    write_json_atomically(RunDir(model_dir).summary, summary)
    logging.info(
        "done at step %d %s: %s; checkpoints and events in %s, summary in %s",
        summary["global_step"],
        took,
        metric_text(summary["eval"]),
        model_dir,
        RunDir(model_dir).summary,
    )
    return summary


def read_state(model_dir: Path) -> dict[str, Any]:
    """What state.json says; {} when there is none (or it cannot be read)."""
    return read_json(RunDir(model_dir).state)


def read_summary(model_dir: Path) -> dict[str, Any]:
    """What summary.json says; {} when there is none (or it cannot be read)."""
    return read_json(RunDir(model_dir).summary)


def last_attempt(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """The latest attempt RunOwner.say recorded in `state` (attempts.py); {} before the first."""
    last: Mapping[str, Any] = (state.get("attempts") or [{}])[-1]
    return last


def read_json(path: Path) -> dict[str, Any]:
    """What the JSON object in `path` says; {} when there is none (or it cannot be read)."""
    try:
        value: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class RunState(str, enum.Enum):
    """What a run's owner says of it in state.json's "state"."""

    RUNNING = "running"
    DONE = "done"
    # On a signal, named beside it, with the step it checkpointed.
    STOPPED = "stopped"
    FAILED = "failed"


def write_json_atomically(path: Path, value: Any) -> None:
    """Writes `value` as JSON so that a reader never sees a half-written file."""
    files.write_atomically(path, json.dumps(value, indent=1) + "\n")

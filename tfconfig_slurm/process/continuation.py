"""A job that may not requeue itself goes on in a new one: its batch script submitted again.

Where `scontrol requeue` is refused (a job submitted with `--no-requeue`, a cluster with
`JobRequeue=0`), the task that requeues submits the job's own batch script again, with the
arguments and the resources the job had (`squeue --format=%o`, `scontrol show job`: nodes,
tasks, CPUs, GPUs, memory, time, partition, account, QOS, the nodes it asked for), to start
once this job has ended (`--dependency=afterany:JOB`), in the same run directory
(EXPERIMENT_ID and TFCONFIG_SLURM_OUTPUT), counted as the job's continuation
(TFCONFIG_SLURM_CONTINUATION) against --max_requeues. The new job id is kept in the run
directory for `tfconfig-slurm runs`.

What cannot be carried: the script's arguments are split at spaces (SLURM keeps them joined),
and sbatch options given on the command line other than the resources below come from the
script's own `#SBATCH` lines. A heterogeneous job, or a step that runs in no batch job (an
`srun` inside `salloc`), cannot go on so: `check` says why, at start.

No TensorFlow here.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from absl import logging

from tfconfig_slurm.cluster.step import CONTINUATION, SlurmJob
from tfconfig_slurm.process import reports, slurm_commands
from tfconfig_slurm.process.run_dir import OUTPUT_ROOT_VARIABLE, RunDir

# The variables of this job that must not reach the next one: SLURM sets its own, and a
# task's TF_CONFIG and GPUs belong to this step.
_THIS_JOB_ONLY = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_")
_THIS_TASK_ONLY = {
    "TF_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
}
_KEPT = {"SLURM_CONF"}
# `scontrol show job --oneliner`: Key=value pairs; keys start with a capital letter.
_FIELD = re.compile(r"(?:^| )([A-Z][A-Za-z/:_]*)=")
_NONE = ("", "(null)", "N/A", "None")


@dataclass(frozen=True)
class Continued:
    """The job a run goes on in, after the job it stopped in."""

    job_id: str
    after: str
    time: float


def job_record(job: str) -> dict[str, str] | str:
    """`scontrol show job` of `job` as a dict, or why it cannot be had (a sentence)."""
    shown = slurm_commands.run(["scontrol", "show", "job", "--oneliner", job])
    if shown is None:
        return "scontrol cannot be run here"
    if shown.returncode != 0:
        return f"scontrol show job failed: {shown.stderr.strip() or shown.returncode}"
    return parse_record(shown.stdout)


def parse_record(text: str) -> dict[str, str]:
    """`scontrol show job --oneliner`'s line as a dict of its fields."""
    text = text.strip()
    marks = list(_FIELD.finditer(text))
    ends = [mark.start() for mark in marks[1:]] + [len(text)]
    return {mark.group(1): text[mark.end() : end] for mark, end in zip(marks, ends)}


def say_at_start(job: SlurmJob) -> None:
    """Says in one line, at start, what a stop (the time limit, the preempt signal) will do
    where `job` may not requeue itself: go on in a new job, or end the run at a checkpoint
    that nothing resumes."""
    record = job_record(job.name)
    if isinstance(record, str):
        logging.warning(
            "job %s: %s, so a stop on the time limit or the preempt signal may neither requeue "
            "it nor go on in a new job",
            job.name,
            record,
        )
        return
    if record.get("Requeue") != "0":
        return
    problem = check(record)
    if not problem:
        logging.info(
            "job %s may not requeue itself (Requeue=0): a stop on the time limit or the preempt "
            "signal goes on in a new job, its batch script submitted again",
            job.name,
        )
        return
    logging.warning(
        "job %s may not requeue itself (Requeue=0), nor can it go on in a new job: %s; a stop "
        "on the time limit or the preempt signal ends the run at a checkpoint that nothing "
        "resumes. HINT: submit it with sbatch --requeue",
        job.name,
        problem,
    )


def check(record: Mapping[str, str]) -> str:
    """Why the job of `record` could not go on in a new job; "" if it could."""
    if shutil.which("sbatch") is None:
        return "sbatch is not installed here"
    if record.get("BatchFlag") != "1":
        return "it runs in no batch job (an srun inside salloc): there is no script to submit"
    if record.get("HetJobId", "") not in _NONE:
        return "it is a heterogeneous job, whose components a new submission cannot repeat"
    script = record.get("Command", "").split(" ")[0]
    if not Path(script).is_file():
        return f"its batch script {script!r} is not there to submit again"
    return ""


def submit(
    job: SlurmJob,
    model_dir: Path,
    environ: Mapping[str, str],
    record: Mapping[str, str],
) -> str:
    """Submits the job of `record` again, to go on after it in `model_dir`; returns the new
    job's id, or raises ContinuationError saying why it could not."""
    problem = check(record)
    if problem:
        raise ContinuationError(problem)
    model_dir = model_dir.resolve()
    listed = slurm_commands.run(["squeue", "--noheader", f"--jobs={job.name}", "--format=%o"])
    if listed is None or listed.returncode != 0 or not listed.stdout.strip():
        raise ContinuationError("squeue did not say the job's command")
    command = listed.stdout.strip().split(" ")
    submitted = slurm_commands.run(
        [
            "sbatch",
            "--parsable",
            f"--dependency=afterany:{job.job_id}",
            *resources(record),
            *command,
        ],
        environ=next_environment(environ, model_dir, job.continuation + 1),
    )
    if submitted is None:
        raise ContinuationError("sbatch cannot be run here")
    if submitted.returncode != 0:
        raise ContinuationError(f"sbatch failed: {submitted.stderr.strip()}")
    new_job = submitted.stdout.strip().split(";")[0]
    reports.write_json_atomically(
        RunDir(model_dir).continuation,
        {"job_id": new_job, "after": job.name, "time": time.time()},
    )
    return new_job


def read(model_dir: Path) -> Continued | None:
    """The job the run in `model_dir` went on in last, if it did."""
    try:
        said = json.loads(RunDir(model_dir).continuation.read_text())
        return Continued(str(said["job_id"]), str(said["after"]), float(said["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ContinuationError(Exception):
    """Why a job could not go on in a new one."""


def resources(record: Mapping[str, str]) -> list[str]:
    """The sbatch options that ask for what the job has: its name, directory, nodes (and the
    ones it asked for or excluded), tasks, CPUs, GPUs, memory, features, time, partition,
    account, QOS, and an array task's index."""
    options = {
        "--job-name": record.get("JobName"),
        "--chdir": record.get("WorkDir"),
        "--nodes": record.get("NumNodes"),
        "--ntasks": record.get("NumTasks"),
        "--cpus-per-task": record.get("CPUs/Task"),
        "--time": record.get("TimeLimit"),
        "--partition": record.get("Partition"),
        "--account": record.get("Account"),
        "--qos": record.get("QOS"),
        "--nodelist": record.get("ReqNodeList"),
        "--exclude": record.get("ExcNodeList"),
        "--constraint": record.get("Features"),
    }
    per_node = record.get("NtasksPerN:B:S:C", "").split(":")[0]
    if per_node.isdigit() and int(per_node) > 0:
        options["--ntasks-per-node"] = per_node
    gres = [
        item.removeprefix("gres:").removeprefix("gres/")
        for item in record.get("TresPerNode", "").split(",")
        if item.startswith(("gres:", "gres/"))
    ]
    if gres:
        options["--gres"] = ",".join(gres)
    for field, option in (("MinMemoryNode", "--mem"), ("MinMemoryCPU", "--mem-per-cpu")):
        if record.get(field, "0") not in ("0", *_NONE):
            options[option] = record[field]
    # An array task (a sweep's run) goes on as the same index, which picks its line.
    if record.get("ArrayTaskId", "").isdigit():
        options["--array"] = record["ArrayTaskId"]
    if options["--time"] == "UNLIMITED":
        del options["--time"]
    return [f"{option}={value}" for option, value in options.items() if value not in (None, *_NONE)]


def next_environment(environ: Mapping[str, str], model_dir: Path, count: int) -> dict[str, str]:
    """This task's environment without what belongs to this job and task, naming the run
    directory and the continuation's count."""
    kept = {
        name: value
        for name, value in environ.items()
        if name in _KEPT or not (name.startswith(_THIS_JOB_ONLY) or name in _THIS_TASK_ONLY)
    }
    return {
        **kept,
        "EXPERIMENT_ID": model_dir.name,
        OUTPUT_ROOT_VARIABLE: str(model_dir.parent),
        CONTINUATION: str(count),
    }

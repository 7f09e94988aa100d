"""A job that may not requeue itself (Requeue=0) goes on in a new one: its batch script
submitted again to start once it has ended, asking for what the job asked for (what SLURM's
record does not show, `NOT_CARRIED`, comes from the script's `#SBATCH` lines), in the same
run directory. No TensorFlow here."""

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
from tfconfig_slurm.process import slurm_commands, timing
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.run_dir import OUTPUT_ROOT_VARIABLE, RunDir

# The batch script's arguments as a JSON list (launch/train.sbatch).
BATCH_ARGS = "TFCONFIG_SLURM_BATCH_ARGS"
# Not for the next job: SLURM sets its own, and a task's TF_CONFIG and GPUs are this step's.
_THIS_JOB_ONLY = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_")
_THIS_TASK_ONLY = {
    "TF_CONFIG",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
    BATCH_ARGS,
}
_KEPT = {"SLURM_CONF"}
# `scontrol show job`: Key=value pairs, several a line; keys start with a capital letter.
_FIELD = re.compile(r"(?:^| )([A-Z][A-Za-z/:_]*)=")
# Free text, which scontrol prints last on its line: the rest of the line, " Key=" and all.
_FREE_TEXT = frozenset(
    {"JobName", "Command", "WorkDir", "Comment", "StdErr", "StdIn", "StdOut", "Reservation"}
)
NO_VALUE = ("", "(null)", "N/A", "None")
# sbatch requests that `scontrol show job` (Slurm 22.05) does not show, said when a job goes on.
NOT_CARRIED = "--signal, --open-mode, --export"


@dataclass(frozen=True)
class Continued:
    """The job a run goes on in, after the job it stopped in."""

    job_id: str
    after: str
    time: float


def job_record(job: str) -> dict[str, str] | str:
    """`scontrol show job` of `job` as a dict, or why it cannot be had (a sentence)."""
    shown = slurm_commands.run(["scontrol", "show", "job", job])
    if shown is None:
        return "scontrol cannot be run here, or did not answer"
    if shown.returncode != 0:
        return f"scontrol show job failed: {shown.stderr.strip() or shown.returncode}"
    return parse_record(shown.stdout)


def parse_record(text: str) -> dict[str, str]:
    """`scontrol show job`'s record of one job as a dict of its fields."""
    fields: dict[str, str] = {}
    for line in (shown.strip() for shown in text.strip().splitlines()):
        marks = list(_FIELD.finditer(line))
        for mark, end in zip(marks, [mark.start() for mark in marks[1:]] + [len(line)]):
            key = mark.group(1)
            if key in _FREE_TEXT:
                fields[key] = line[mark.end() :]
                break
            fields[key] = line[mark.end() : end]
    return fields


def requeued(record: Mapping[str, str], restart_count: int) -> bool:
    """Whether the job of `record` was requeued since its run `restart_count` started."""
    restarts = record.get("Restarts", "")
    return restarts.isdigit() and int(restarts) > restart_count


def batch_command(record: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """The batch script and its arguments: as handed on (BATCH_ARGS), else split at spaces."""
    command = record.get("Command", "")
    try:
        arguments = json.loads(environ.get(BATCH_ARGS, ""))
    except ValueError:
        arguments = None
    if isinstance(arguments, list) and all(isinstance(word, str) for word in arguments):
        joined = " ".join(arguments)
        if not arguments:
            return [command]
        if command.endswith(" " + joined):
            return [command[: -len(joined) - 1], *arguments]
    return command.split(" ")


def say_at_start(job: SlurmJob, environ: Mapping[str, str]) -> None:
    """Says at start what a stop will do where `job` may not requeue itself."""
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
    problem = check(record, environ)
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


def check(record: Mapping[str, str], environ: Mapping[str, str]) -> str:
    """Why the job of `record` could not go on in a new job; "" if it could."""
    if shutil.which("sbatch") is None:
        return "sbatch is not installed here"
    if record.get("BatchFlag") != "1":
        return "it runs in no batch job (an srun inside salloc): there is no script to submit"
    if record.get("HetJobId", "") not in NO_VALUE:
        return "it is a heterogeneous job, whose components a new submission cannot repeat"
    script = batch_command(record, environ)[0]
    if not Path(script).is_file():
        return f"its batch script {script!r} is not there to submit again"
    return ""


def submit(
    job: SlurmJob,
    model_dir: Path,
    environ: Mapping[str, str],
    record: Mapping[str, str],
) -> str:
    """Submits the job of `record` again, to go on after it in `model_dir`: the new job's id."""
    problem = check(record, environ)
    if problem:
        raise ContinuationError(problem)
    model_dir = model_dir.resolve()
    try:
        # Made exclusively (O_EXCL): two tasks may continue the job at once.
        RunDir(model_dir).continuation_claim(job.name).touch(exist_ok=False)
    except FileExistsError:
        return _submitted_by_another(model_dir, job)
    submitted = slurm_commands.sbatch(
        [
            f"--dependency=afterany:{job.job_id}",
            *resources(record),
            *batch_command(record, environ),
        ],
        environ=next_environment(environ, model_dir, job.continuation + 1),
    )
    if submitted.problem:
        raise ContinuationError(submitted.problem)
    reports.write_json_atomically(
        RunDir(model_dir).continuation,
        {"job_id": submitted.job_id, "after": job.name, "time": time.time()},
    )
    return submitted.job_id


def _submitted_by_another(model_dir: Path, job: SlurmJob) -> str:
    """The job another task, which claimed it first, submitted to continue `job`."""
    seconds = timing.SLURM_COMMAND_SECONDS * 2
    continued = timing.poll(
        lambda: read(model_dir), lambda said: said is not None and said.after == job.name, seconds
    )
    if continued is None or continued.after != job.name:
        raise ContinuationError(
            f"another task of job {job.name} claimed its continuation and named no job within "
            f"{seconds:.0f} s"
        )
    return continued.job_id


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
    """The sbatch options that ask for what the job of `record` asked for."""
    options = {**_named_options(record), **_asked(record)}
    # An array task (a sweep's run) goes on as the same index, which picks its line.
    if record.get("ArrayTaskId", "").isdigit():
        options["--array"] = record["ArrayTaskId"]
    if options["--time"] == "UNLIMITED":
        del options["--time"]
    # sbatch takes one of each pair (a record shows CPUs/Task, 1 by default, beside it).
    if options["--cpus-per-gpu"]:
        del options["--cpus-per-task"]
    if options["--mem-per-gpu"]:
        options.pop("--mem", None)
        options.pop("--mem-per-cpu", None)
    switches = {
        "--exclusive": record.get("OverSubscribe") == "NO",
        "--exclusive=user": record.get("OverSubscribe") == "USER",
        "--exclusive=mcs": record.get("OverSubscribe") == "MCS",
        "--oversubscribe": record.get("OverSubscribe") == "YES",
        "--contiguous": record.get("Contiguous") == "1",
        "--no-requeue": record.get("Requeue") == "0",
    }
    return [
        f"{option}={value}" for option, value in options.items() if value not in (None, *NO_VALUE)
    ] + [switch for switch, given in switches.items() if given]


def _named_options(record: Mapping[str, str]) -> dict[str, str | None]:
    """The options whose value a field of `record` gives as it is (output files aside)."""
    options = {
        "--job-name": record.get("JobName"),
        "--chdir": record.get("WorkDir"),
        "--output": _pattern(record.get("StdOut", ""), record),
        "--nodes": record.get("NumNodes"),
        "--ntasks": record.get("NumTasks"),
        "--cpus-per-task": record.get("CPUs/Task"),
        "--time": record.get("TimeLimit"),
        "--time-min": record.get("TimeMin"),
        "--partition": record.get("Partition"),
        "--account": record.get("Account"),
        "--qos": record.get("QOS"),
        "--reservation": record.get("Reservation"),
        "--licenses": record.get("Licenses"),
        "--nodelist": record.get("ReqNodeList"),
        "--exclude": record.get("ExcNodeList"),
        "--constraint": record.get("Features"),
        "--comment": record.get("Comment"),
        "--mail-user": record.get("MailUser"),
        "--mail-type": record.get("MailType"),
    }
    if record.get("StdErr", "") != record.get("StdOut", ""):
        options["--error"] = _pattern(record.get("StdErr", ""), record)
    return options


def _asked(record: Mapping[str, str]) -> dict[str, str | None]:
    """Tasks, sockets and generic resources a node, GPUs (with their memory and CPUs), memory,
    temporary disk and nice, where `record` asked for them."""
    options: dict[str, str | None] = {}
    per_node = record.get("NtasksPerN:B:S:C", "").split(":")[0]
    if per_node.isdigit() and int(per_node) > 0:
        options["--ntasks-per-node"] = per_node
    if record.get("Socks/Node", "*").isdigit():
        options["--sockets-per-node"] = record["Socks/Node"]
    gres = [
        item.removeprefix("gres:").removeprefix("gres/")
        for item in record.get("TresPerNode", "").split(",")
        if item.startswith(("gres:", "gres/"))
    ]
    if gres:
        options["--gres"] = ",".join(gres)
    for field, option in (
        ("TresPerJob", "--gpus"),
        ("TresPerTask", "--gpus-per-task"),
        ("TresPerSocket", "--gpus-per-socket"),
        ("MemPerTres", "--mem-per-gpu"),
        ("CpusPerTres", "--cpus-per-gpu"),
    ):
        # As --gpus takes them (`gres:gpu:a100:2`: `a100:2`).
        gpus = (
            item.removeprefix(prefix)
            for item in record.get(field, "").split(",")
            for prefix in ("gres:gpu:", "gres/gpu:", "gres/gpu=")
            if item.startswith(prefix)
        )
        options[option] = next(gpus, None)
    for field, option in (
        ("MinMemoryNode", "--mem"),
        ("MinMemoryCPU", "--mem-per-cpu"),
        ("MinTmpDiskNode", "--tmp"),
        ("Nice", "--nice"),
    ):
        if record.get(field, "0") not in ("0", *NO_VALUE):
            options[option] = record[field]
    return options


def _pattern(path: str, record: Mapping[str, str]) -> str | None:
    """An output file as SLURM shows it, this job's id in its name (not in its folders nor
    the job's name, which may hold the same number) made %j for the next job's own file."""
    if not path:
        return None
    folder, _, name = path.rpartition("/")
    ids = {record.get("JobId", ""), record.get("ArrayJobId", "")} - {""}
    job_name = record.get("JobName", "")
    pieces = name.split(job_name) if job_name else [name]
    # A NUL (which no file name holds) stands for each id until the name's own %s are escaped.
    for job_id in ids:
        pieces = [re.sub(rf"(?<!\d){re.escape(job_id)}(?!\d)", "\0", piece) for piece in pieces]
    name = job_name.join(pieces).replace("%", "%%").replace("\0", "%j")
    return f"{folder.replace('%', '%%')}/{name}" if folder or path.startswith("/") else name


def next_environment(environ: Mapping[str, str], model_dir: Path, count: int) -> dict[str, str]:
    """This task's environment without this job's and task's own, for continuation `count`."""
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

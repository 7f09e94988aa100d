"""A job that may not requeue itself goes on in a new one: what is carried from `scontrol show
job` into the new submission, and what is left behind; on the test cluster, each request given
on sbatch's command line asked for again, and a requeue already done not submitted again."""

from __future__ import annotations

import concurrent.futures
import json
import logging
from pathlib import Path

import pytest

from tests.cli import REPOSITORY, wait_until
from tests.slurm_cluster import SlurmCluster
from tfconfig_slurm import errors
from tfconfig_slurm.cluster.step import CONTINUATION, Allocation, read_slurm_job
from tfconfig_slurm.process.job import continuation, what_follows

# A running job of the test cluster, from `scontrol show job` (its script's path made
# @REPOSITORY@'s): `sbatch --nodelist='node[2-3]' --nodes=2 --ntasks-per-node=2 --gres=gpu:1
# --comment="first try Key=1" train.sbatch --log_every_steps=10 --hparams="a=1 b=2"`, from a
# folder with a space in its name.
RECORD = (
    (Path(__file__).parent / "fixtures" / "scontrol-show-job.txt")
    .read_text()
    .replace("@REPOSITORY@", str(REPOSITORY))
)
SCRIPT = str(REPOSITORY / "launch" / "train.sbatch")
ARGUMENTS = ["--log_every_steps=10", "--hparams=a=1 b=2"]
# What launch/train.sbatch exports: its arguments whole.
HANDED_ON = {continuation.BATCH_ARGS: json.dumps(ARGUMENTS)}


def parsed(text: str) -> dict[str, str]:
    return continuation.parse_record(text)


def test_each_field_keeps_its_value_spaces_and_key_like_words_included() -> None:
    record = parsed(RECORD)
    assert record["Command"] == f"{SCRIPT} --log_every_steps=10 --hparams=a=1 b=2"
    assert record["WorkDir"] == "/tmp/cap/my runs"
    assert record["Comment"] == "first try Key=1"
    assert "Key" not in record
    assert (record["NtasksPerN:B:S:C"], record["CPUs/Task"]) == ("2:0:*:*", "1")
    assert (record["TresPerNode"], record["Requeue"], record["Account"]) == (
        "gres:gpu:1",
        "1",
        "(null)",
    )
    assert (record["JobId"], record["JobName"], record["Restarts"]) == ("1", "train.sbatch", "0")


def test_the_script_s_arguments_go_on_whole_where_it_hands_them_on() -> None:
    record = parsed(RECORD)
    assert continuation.batch_command(record, HANDED_ON) == [SCRIPT, *ARGUMENTS]
    # A batch script of the user's own: SLURM's command line, split at spaces.
    assert continuation.batch_command(record, {}) == [
        SCRIPT, "--log_every_steps=10", "--hparams=a=1", "b=2",
    ]  # fmt: skip
    # No arguments: the whole command line is the script, spaces and all.
    alone = parsed(RECORD.replace(f"Command={SCRIPT} --log_every_steps=10 --hparams=a=1 b=2",
                                  "Command=/tmp/cap/my runs/train.sbatch"))  # fmt: skip
    assert continuation.batch_command(alone, {continuation.BATCH_ARGS: "[]"}) == [
        "/tmp/cap/my runs/train.sbatch"
    ]


def test_the_new_job_asks_for_what_this_one_has() -> None:
    options = continuation.resources(parsed(RECORD))
    assert options == [
        "--job-name=train.sbatch",
        "--chdir=/tmp/cap/my runs",
        "--output=/tmp/cap/my runs/slurm-%j.out",
        "--nodes=2",
        "--ntasks=4",
        "--cpus-per-task=1",
        "--time=365-00:00:00",
        "--partition=debug",
        "--nodelist=node[2-3]",
        "--comment=first try Key=1",
        "--ntasks-per-node=2",
        "--gres=gpu:1",
    ]


@pytest.mark.parametrize(
    ("shown", "options"),
    [
        ("TresPerJob=gres:gpu:2", ["--gpus=2"]),
        ("TresPerJob=gres:gpu:a100:2", ["--gpus=a100:2"]),
        ("TresPerTask=gres:gpu:1", ["--gpus-per-task=1"]),
        ("TresPerSocket=gres:gpu:1", ["--gpus-per-socket=1"]),
        ("MemPerTres=gres:gpu:100", ["--mem-per-gpu=100"]),
        # sbatch refuses --cpus-per-task beside it.
        ("CpusPerTres=gres:gpu:3", ["--cpus-per-gpu=3"]),
        ("Reservation=maint", ["--reservation=maint"]),
        ("MailUser=u@x MailType=END,FAIL", ["--mail-user=u@x", "--mail-type=END,FAIL"]),
    ],
)
def test_a_request_slurm_shows_goes_on(shown: str, options: list[str]) -> None:
    record = parsed(RECORD.replace("   Power=", f"   {shown}\n   Power="))
    added = [option for option in continuation.resources(record) if option not in BASE]
    assert added == options
    assert ("--cpus-per-task=1" in continuation.resources(record)) != ("CpusPerTres" in shown)


@pytest.mark.parametrize(
    ("old", "new", "option"),
    [
        ("OverSubscribe=OK", "OverSubscribe=NO", "--exclusive"),
        ("OverSubscribe=OK", "OverSubscribe=USER", "--exclusive=user"),
        ("Requeue=1", "Requeue=0", "--no-requeue"),
        ("Licenses=(null)", "Licenses=scratch:2", "--licenses=scratch:2"),
        ("MinTmpDiskNode=0", "MinTmpDiskNode=100M", "--tmp=100M"),
        ("MinMemoryNode=0", "MinMemoryNode=200M", "--mem=200M"),
        ("Nice=0", "Nice=5", "--nice=5"),
        ("TimeMin=N/A", "TimeMin=00:05:00", "--time-min=00:05:00"),
        ("Socks/Node=*", "Socks/Node=1", "--sockets-per-node=1"),
        (
            "StdErr=/tmp/cap/my runs/slurm-1.out",
            "StdErr=/tmp/cap/1/err-1.txt",
            "--error=/tmp/cap/1/err-%j.txt",
        ),
    ],
)
def test_a_request_in_a_field_of_its_own_goes_on(old: str, new: str, option: str) -> None:
    added = [o for o in continuation.resources(parsed(RECORD.replace(old, new))) if o not in BASE]
    assert added == [option]


BASE = continuation.resources(parsed(RECORD))


def test_an_array_task_goes_on_as_the_same_index_and_writes_its_own_file() -> None:
    """A sweep's run: its index picks its line of the sweep file (--sweep_file), in the new
    job as in this one; its output, named by the array's job id, is the new job's own."""
    record = parsed(
        RECORD.replace("JobId=1 ", "JobId=42 ArrayJobId=41 ArrayTaskId=3 ").replace(
            "slurm-1.out", "lr-41_3.out"
        )
    )
    options = continuation.resources(record)
    assert options[-1] == "--array=3"
    assert "--output=/tmp/cap/my runs/lr-%j_3.out" in options
    assert "--array" not in " ".join(BASE)


def test_a_requeue_is_seen_in_the_restarts_since_this_run_started() -> None:
    assert not continuation.requeued(parsed(RECORD), 0)
    assert continuation.requeued(parsed(RECORD.replace("Restarts=0", "Restarts=1")), 0)
    assert not continuation.requeued(parsed(RECORD.replace("Restarts=0", "Restarts=1")), 1)


def test_the_new_job_gets_none_of_this_job_s_variables_but_the_run_s_directory() -> None:
    environ = {
        "PATH": "/usr/bin",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_JOB_ID": "31",
        "SLURM_ARRAY_TASK_ID": "2",
        "SBATCH_TIMELIMIT": "5",
        "TF_CONFIG": "{}",
        "CUDA_VISIBLE_DEVICES": "0",
        "EXPERIMENT_ID": "other",
        CONTINUATION: "1",
    }
    got = continuation.next_environment(environ, Path("/scratch/runs/lr-3"), 2)
    assert got == {
        "PATH": "/usr/bin",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "EXPERIMENT_ID": "lr-3",
        "TFCONFIG_SLURM_OUTPUT": "/scratch/runs",
        CONTINUATION: "2",
    }


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("BatchFlag=1", "BatchFlag=0", "it runs in no batch job"),
        ("Requeue=1", "HetJobId=30 Requeue=1", "it is a heterogeneous job"),
        (str(REPOSITORY), "/no where", "batch script '/no where/launch/train.sbatch' is not"),
        (str(REPOSITORY), "/nowhere", "batch script '/nowhere/launch/train.sbatch' is not there"),
    ],
)
def test_what_cannot_go_on_says_why(old: str, new: str, why: str) -> None:
    assert why in continuation.check(parsed(RECORD.replace(old, new)), HANDED_ON)


def test_a_job_that_can_go_on_has_nothing_against_it() -> None:
    assert continuation.check(parsed(RECORD), HANDED_ON) == ""


# The requests a continuation carries, given on sbatch's command line, of a held job (it never
# runs), in two jobs (sbatch refuses some together): --licenses from the cluster's slurm.conf,
# --reservation made by the test, --constraint a feature of its nodes. Not here: --account
# and --qos (the test cluster keeps no accounting database).
GIVEN = (
    (
        "--job-name=my job Key=1", "--comment=first try Key=2", "--nodes=1", "--ntasks=2",
        "--gpus=2", "--gpus-per-task=1", "--mem-per-gpu=100", "--cpus-per-gpu=1",
        "--exclusive", "--licenses=scratch:2", "--reservation=continued",
        "--output=%x-%j.out", "--error=err/%j.txt", "--time=10", "--time-min=5", "--tmp=10",
        "--nice=5", "--no-requeue", "--mail-type=END", "--mail-user=someone@example.org",
        "--exclude=node1",
    ),
    (
        "--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=2", "--gres=gpu:1",
        "--mem=200", "--nodelist=node[2-3]", "--partition=debug", "--constraint=testnode",
    ),
    ("--ntasks=1", "--mem-per-cpu=50", "--sockets-per-node=1", "--gpus-per-socket=1"),
)  # fmt: skip
# The fields of `scontrol show job` that say what a job asked for.
ASKED = (
    "JobName", "Comment", "NumNodes", "NumTasks", "CPUs/Task", "TresPerJob", "TresPerTask",
    "MemPerTres", "CpusPerTres", "OverSubscribe", "Licenses", "Reservation", "TimeLimit",
    "TimeMin", "MinTmpDiskNode", "Nice", "Requeue", "MailType", "MailUser", "ExcNodeList",
    "WorkDir", "Partition", "Features", "ReqNodeList", "NtasksPerN:B:S:C", "TresPerNode",
    "TresPerSocket", "Socks/Node", "MinMemoryNode", "MinMemoryCPU",
)  # fmt: skip


@pytest.mark.slurm
def test_every_request_on_sbatch_s_command_line_is_asked_for_again(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "my script.sbatch"
    script.write_text("#!/bin/bash\nsleep 60\n")
    reserved = slurm_cluster.run(
        ["scontrol", "create", "reservation", "ReservationName=continued", "Nodes=node3",
         "StartTime=now", "Duration=10", "Users=root", "Flags=IGNORE_JOBS"],
    )  # fmt: skip
    assert reserved.returncode == 0, reserved.stderr
    jobs: list[str] = []
    records = []
    try:
        for given in GIVEN:
            jobs.append(held(slurm_cluster, tmp_path, [*given, str(script)]))
            record = parsed(slurm_cluster.run(["scontrol", "show", "job", jobs[-1]]).stdout)
            options = continuation.resources(record)
            jobs.append(held(slurm_cluster, tmp_path, [*options, str(script)]))
            again = parsed(slurm_cluster.run(["scontrol", "show", "job", jobs[-1]]).stdout)
            records.append((record, again))
    finally:
        slurm_cluster.run(["scancel", *jobs])
        slurm_cluster.run(["scontrol", "delete", "ReservationName=continued"])
    for record, again in records:
        assert asked(again) == asked(record)
    first = records[0][0]
    assert first["Reservation"] == "continued" and first["Licenses"] == "scratch:2"
    assert first["OverSubscribe"] == "NO" and first["TresPerTask"] == "gres:gpu:1"
    assert (records[1][0]["TresPerNode"], records[1][0]["Features"]) == ("gres:gpu:1", "testnode")
    assert records[2][0]["TresPerSocket"] == "gres:gpu:1"
    # Each writes files of its own, named by its own id.
    assert records[0][1]["StdOut"] == f"{tmp_path}/my job Key=1-{jobs[1]}.out"
    assert records[0][1]["StdErr"] == f"{tmp_path}/err/{jobs[1]}.txt"


def asked(record: dict[str, str]) -> dict[str, str | None]:
    """What a job asked for, as its record says it: a count of nodes given as a range of one
    (a pending job's `1-1`) as the count."""
    fields = {field: record.get(field) for field in ASKED}
    low, _, high = (fields["NumNodes"] or "").partition("-")
    fields["NumNodes"] = low if low == high else fields["NumNodes"]
    return fields


def held(cluster: SlurmCluster, folder: Path, command: list[str]) -> str:
    submitted = cluster.run(["sbatch", "--parsable", "--hold", *command], cwd=folder)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


@pytest.mark.slurm
def test_a_requeue_already_done_is_not_submitted_again_as_a_new_job(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`scontrol requeue` that fails where the job was requeued all the same (slurmctld
    answered after scontrol gave up): the job runs again, and no second job is submitted."""
    script = tmp_path / "sleeps.sbatch"
    script.write_text("#!/bin/bash\nsleep 120\n")
    submitted = slurm_cluster.run(["sbatch", "--parsable", str(script)], cwd=tmp_path)
    job = submitted.stdout.strip()
    try:
        assert wait_until(lambda: slurm_cluster.job(job)["JobState"] == "RUNNING", 30.0)
        requeued = slurm_cluster.run(["scontrol", "requeue", job])
        assert requeued.returncode == 0, requeued.stderr
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        with caplog.at_level(logging.INFO):
            environ = {"SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": "0"}
            status = what_follows.requeue(
                environ, read_slurm_job(environ), 3, "SIGUSR1", tmp_path / "run"
            )
        listed = slurm_cluster.run(
            ["squeue", "--noheader", "--format=%i", f"--partition={slurm_cluster.partition}"]
        ).stdout.split()
    finally:
        slurm_cluster.run(["scancel", job])
    assert status == 0
    assert f"`scontrol requeue {job}` said " in caplog.text
    assert "but the job was requeued (Restarts=1)" in caplog.text
    # No job submitted after it (an earlier test's may still be ending).
    assert [other for other in listed if int(other) > int(job)] == []
    assert continuation.read(tmp_path / "run") is None


@pytest.mark.slurm
def test_a_requeue_that_fails_where_slurm_may_requeue_submits_no_second_job(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`scontrol requeue` refused for another reason than Requeue=0 (here: the job has not
    started): nothing is submitted beside it, and the run says how to resume."""
    held_job = held(slurm_cluster, tmp_path, [str(REPOSITORY / "launch" / "train.sbatch")])
    try:
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        with caplog.at_level(logging.INFO):
            environ = {"SLURM_JOB_ID": held_job}
            status = what_follows.requeue(
                environ, read_slurm_job(environ), 3, "SIGUSR1", tmp_path / "run"
            )
        listed = slurm_cluster.run(
            ["squeue", "--noheader", "--format=%i", f"--partition={slurm_cluster.partition}"]
        ).stdout.split()
    finally:
        slurm_cluster.run(["scancel", held_job])
    assert status == errors.ExitStatus.NOT_REQUEUED
    assert "SLURM may requeue it (Requeue=1), so it does not go on in a new job" in caplog.text
    # No job submitted after it (an earlier test's may still be ending).
    assert [other for other in listed if int(other) > int(held_job)] == []
    assert continuation.read(tmp_path / "run") is None


@pytest.mark.slurm
def test_two_tasks_that_continue_a_job_at_once_submit_one_job(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#52: a job that may not requeue, ended by a node's failure with --requeue_on_sigterm:
    the chief's requeue and the batch script both continue it, the second before the first
    has said which job it submitted. One job is submitted, and both name it."""
    held_job = held(slurm_cluster, tmp_path, ["--no-requeue", SCRIPT])
    (tmp_path / "run").mkdir()
    submitted: list[str] = []
    try:
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        environ = {"SLURM_JOB_ID": held_job, **slurm_cluster.environ()}
        job, record = read_slurm_job(environ), continuation.job_record(held_job)
        assert job is not None and isinstance(record, dict) and record["Requeue"] == "0", record
        with concurrent.futures.ThreadPoolExecutor(2) as both:
            submitted = list(
                both.map(
                    lambda _: continuation.submit(job, tmp_path / "run", environ, record), range(2)
                )
            )
        listed = slurm_cluster.run(
            ["squeue", "--noheader", "--format=%i", f"--partition={slurm_cluster.partition}"]
        ).stdout.split()
    finally:
        slurm_cluster.run(["scancel", held_job, *submitted])
    assert len(set(submitted)) == 1, submitted
    assert [other for other in listed if int(other) > int(held_job)] == submitted[:1]


@pytest.mark.slurm
def test_a_node_the_job_no_longer_lists_but_slurm_says_is_up_did_not_fail(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#53: a job that ends (a requeue's, a time limit's) lists fewer nodes as each one
    completes, and the batch script said `node2 failed, and Slurm ends job 7 and requeues it`
    of a node that had only released it, every node idle. A node is said to have failed only
    where Slurm says it is down."""
    script = tmp_path / "sleeps.sbatch"
    script.write_text("#!/bin/bash\nsleep 120\n")
    submitted = slurm_cluster.run(["sbatch", "--parsable", "--nodes=1", str(script)], cwd=tmp_path)
    job = submitted.stdout.strip()
    try:
        assert wait_until(lambda: slurm_cluster.job(job)["JobState"] == "RUNNING", 30.0)
        node = slurm_cluster.job(job)["NodeList"]
        # As the job held two nodes, the other one released already.
        other = next(each for each in slurm_cluster.nodes if each != node)
        monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
        environ = {"SLURM_JOB_ID": job, **slurm_cluster.environ()}
        slurm_job = read_slurm_job(environ)
        assert slurm_job is not None
        held = Allocation((node, other), (1, 1), (1, 1))
        said = what_follows.after_node_failure(tmp_path, slurm_job, held, environ, 2)
    finally:
        slurm_cluster.run(["scancel", job])
    assert said == ""

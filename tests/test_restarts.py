"""The lines for a step that failed (`tfconfig-slurm srun`): the first to fail from the run's
failure record, else from srun's message and that task's log; and whether the step starts
again in the job (process/job/what_follows.py). No TensorFlow, no SLURM: the job is a value, or an
environment dictionary."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfconfig_slurm.cluster.step import Allocation, SlurmJob
from tfconfig_slurm.process.job import restarts, what_follows
from tfconfig_slurm.process.records import reports
from tfconfig_slurm.process.records.failure import Failure
from tfconfig_slurm.process.supervision import watchdog

JOB = SlurmJob(42, None, None, 1)
LOST = Failure(
    "worker 0", "node2", "stopped answering: killed, or its node cut off", None, "ps 0", 20.0
)


def recorded(model_dir: Path, run_id: str, failure: Failure) -> None:
    (model_dir / "failures").mkdir(exist_ok=True)
    (model_dir / "failures" / f"{run_id}.json").write_text(json.dumps(dataclasses.asdict(failure)))


def test_the_first_record_of_this_step_names_the_task(tmp_path: Path) -> None:
    # Another job's, this job's earlier run's and an earlier step's are not this step's.
    earlier = dataclasses.replace(LOST, task="chief 0", time=1.0)
    recorded(tmp_path, "41.0.1", earlier)
    recorded(tmp_path, "42.0.0", earlier)
    recorded(tmp_path, "42.0.1", earlier)
    recorded(tmp_path, "42.1.1", LOST)
    step = restarts.read_step(
        tmp_path, JOB, status=137, started=10.0, checkpoint_at_start=None, srun_said=""
    )
    said = restarts.line(tmp_path, JOB, step, "train")
    assert said == (
        "train: the step failed (exit 137); first to fail: worker 0 on node2: stopped "
        "answering: killed, or its node cut off, seen by ps 0"
    )
    # Where the batch script keeps task logs in the run's logs/ (launch/train.sbatch), there.
    (tmp_path / "logs").mkdir()
    assert restarts.line(tmp_path, JOB, step, "train").endswith(
        f"seen by ps 0; task logs in {tmp_path / 'logs'}"
    )


def said_of_step(model_dir: Path, status: int, srun_said: str) -> str:
    """The line `mine` says of a step of job 7_2 that ended with `status`, srun having said
    `srun_said`, and no failure recorded."""
    job = SlurmJob(9, 7, 2, 0)
    step = restarts.read_step(
        model_dir, job, status=status, started=0.0, checkpoint_at_start=None, srun_said=srun_said
    )
    return restarts.line(model_dir, job, step, "mine")


def test_without_a_record_srun_s_message_and_the_task_s_log_name_it(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job7_2-task3.log").write_text(
        "I1127 worker 1 on node2 at node2:10001 with GPUs [0]\n"
        "tfconfig-slurm-run: --roles: wrong. HINT: fix it\n"
        "slurmstepd: error: *** STEP 7.0 CANCELLED ***\n"
    )
    srun_said = (
        "srun: error: node2: tasks 3-5: Exited with exit code 2\nsrun: Terminating StepId=7.0\n"
    )
    assert said_of_step(tmp_path, 2, srun_said) == (
        "mine: the step failed (exit 2); first to fail: node2: tasks 3-5: Exited with exit code "
        "2 (worker 1 on node2); its last line: tfconfig-slurm-run: --roles: wrong. HINT: fix "
        f"it; task logs in {tmp_path / 'logs'}"
    )


@pytest.mark.parametrize(
    ("first", "srun_said", "again"),
    [
        # A task killed: its watcher saw it stop answering; with-tfconfig's command by a signal.
        (LOST, "", True),
        # A peer whose port refused once a collective with it failed (watchdog.REFUSED).
        (Failure("worker 2", "n2", watchdog.REFUSED.recorded, None, "worker 1", 1.0), "", True),
        (Failure("ps 0", "n1", watchdog.silence(4.0).recorded, None, "chief 0", 1.0), "", True),
        (Failure("worker 1", "n2", "its command was killed by SIGKILL", 137, None, 1.0), "", True),
        # No record, and srun names a kill, or the out-of-memory killer.
        (None, "srun: error: node2: task 3: Killed", True),
        (None, "slurmstepd: error: Detected 1 oom_kill event in StepId=5.0", True),
        (None, "srun: error: node1: task 0: Out Of Memory", True),
        # The run's code: an exception, refused input, a peer that said its command failed.
        (Failure("chief 0", "n1", "ValueError: bad batch", 1, None, 1.0), "", False),
        (Failure("chief 0", "n1", "--hparams: no such", 2, None, 1.0), "", False),
        (Failure("worker 0", "n2", "its command failed", None, "ps 0", 1.0), "", False),
        # srun names an exit status, not a signal: not known to pass.
        (None, "srun: error: node2: task 3: Exited with exit code 1", False),
        # ... first, and then the tasks it killed after it: the first is the cause.
        (None, "node2: task 3: Exited with exit code 2\nnode1: tasks 0-2: Killed\n", False),
        # A crash would come again.
        (Failure("ps 0", "n1", "its command was killed by SIGSEGV", 139, None, 1.0), "", False),
        # #52: also where its peers recorded it first, as a loss, within milliseconds.
        (LOST, "srun: error: node2: task 1: Segmentation fault (core dumped)\n", False),
        (LOST, "srun: error: node2: task 1: Aborted (core dumped)\n", False),
    ],
)
def test_only_a_failure_outside_the_run_s_code_is_worth_a_restart(
    first: Failure | None, srun_said: str, again: bool
) -> None:
    assert restarts.verdict(first, srun_said, trained=True).again is again
    # A restart that failed before it trained a step would fail so again.
    assert not restarts.verdict(first, srun_said, trained=False).again


@pytest.mark.parametrize(
    ("first", "srun_said", "refused"),
    [
        (Failure("chief 0", "n1", "--hparams: no such", 2, None, 1.0), "", True),
        (Failure("chief 0", "n1", "ValueError: bad batch", 1, None, 1.0), "", False),
        # A peer that recorded the refusing task lost is no refusal of its own.
        (Failure("worker 0", "n2", "its command failed", 2, "ps 0", 1.0), "", False),
        # No record (a refusal before the task attached it): srun's first task line says it.
        (None, "srun: error: node2: tasks 3-5: Exited with exit code 2\n", True),
        (None, "srun: error: node2: task 1: Terminated\n", False),
    ],
)
def test_a_step_whose_first_task_refused_its_input_is_told_apart(
    first: Failure | None, srun_said: str, refused: bool
) -> None:
    assert restarts.refused(restarts.Step(143, 0.0, None, first, srun_said)) is refused


def failed_step(
    model_dir: Path,
    started: float,
    checkpoint_at_start: int | None = None,
    progress_at_start: object = None,
) -> restarts.Step:
    return restarts.read_step(
        model_dir, JOB, status=137, started=started, checkpoint_at_start=checkpoint_at_start,
        srun_said="", progress_at_start=progress_at_start,
    )  # fmt: skip


def test_a_killed_task_starts_the_step_again_until_the_job_made_its_restarts(
    tmp_path: Path,
) -> None:
    """The restart is said with its cause and the checkpoint the run resumes from (the caller
    keeps it in state.json: nothing is written here); the last one allowed made, the job ends
    and says why."""
    recorded(tmp_path, "42.1.1", LOST)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-40"\n')
    said, cause = what_follows.after_failure(
        tmp_path, JOB, failed_step(tmp_path, 10.0), done=0, most=2, who="train"
    )
    assert cause == "worker 0 stopped answering" and said == (
        "train: starting the step again in job 42 (restart 1 of at most 2), from the checkpoint "
        "of step 40: worker 0 stopped answering"
    )
    assert not (tmp_path / "state.json").exists()
    # The restart trained (it kept a progress since it started: #52, whatever the chief's clock
    # says, here 22 s behind the batch node's), and failed of a kill again.
    at_start = restarts.progress_mark(tmp_path)
    reports.write_json_atomically(tmp_path / "progress.json", {"global_step": 50, "time": 3.0})
    recorded(tmp_path, "42.2.1", dataclasses.replace(LOST, time=40.0))
    said, cause = what_follows.after_failure(
        tmp_path, JOB, failed_step(tmp_path, 25.0, None, at_start), done=2, most=2, who="train"
    )
    assert cause is None and said == (
        "train: not starting the step again: worker 0 stopped answering, and the job made its 2 "
        "restart(s) (--max_restarts)"
    )
    # One that kept no progress after it started does not loop.
    at_start = restarts.progress_mark(tmp_path)
    said, cause = what_follows.after_failure(
        tmp_path, JOB, failed_step(tmp_path, 35.0, 40, at_start), done=1, most=2, who="train"
    )
    assert cause is None and said.endswith("it failed before it trained a step")
    # A script of the user's logs no progress: a checkpoint of a later step than at the start
    # says that it trained.
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-60"\n')
    _, cause = what_follows.after_failure(
        tmp_path, JOB, failed_step(tmp_path, 35.0, 40, at_start), done=1, most=2, who="train"
    )
    assert cause == "worker 0 stopped answering"


def test_a_task_that_never_ran_is_named_with_slurmstepd_s_error(tmp_path: Path) -> None:
    """A command not found: the task wrote no line of its own, and its node's slurmstepd said
    why (another node's error is not its)."""
    srun_said = (
        "slurmstepd-node3: error: execve(): nosuchcmd: No such file or directory\n"
        "slurmstepd-node1: error: couldn't chdir to `/gone': No such file or directory\n"
        "srun: error: node3: task 0: Exited with exit code 2\n"
    )
    assert said_of_step(tmp_path, 2, srun_said) == (
        "mine: the step failed (exit 2); first to fail: node3: task 0: Exited with exit code 2; "
        "slurmstepd-node3: error: execve(): nosuchcmd: No such file or directory"
    )


@pytest.mark.parametrize(
    ("srun_said", "said"),
    [
        ("srun: unrecognized option '--bogus'\n", ": srun's own last line: srun: unrecognized "
         "option '--bogus'"),
        ("", ", nor any line of srun's"),
    ],
)  # fmt: skip
def test_a_step_that_names_no_task_says_srun_s_own_last_line_or_that_it_said_none(
    tmp_path: Path, srun_said: str, said: str
) -> None:
    assert said_of_step(tmp_path, 255, srun_said) == (
        f"mine: the step failed (exit 255) with no task named{said}"
    )


def test_a_node_that_left_the_job_starts_the_step_again_on_the_nodes_left(
    tmp_path: Path,
) -> None:
    """A --no-kill job's node failed: its peers' tasks failed for it, in their own code (an
    all-reduce that lost a peer raises), but the node is the cause, and the step starts again
    on the nodes left; within --max_restarts still."""
    recorded(tmp_path, "42.1.1", Failure("chief 0", "node1", "UnavailableError: x", 1, None, 20))
    step = failed_step(tmp_path, 10.0)
    assert not restarts.verdict(step.first, "", trained=True).again
    # The record is that of a task cut off with the node, which lost its peers first.
    assert restarts.line(tmp_path, JOB, step, "train", ("node2",)) == (
        "train: the step failed (exit 137): node2 left job 42: its node failed"
    )
    said, cause = what_follows.after_failure(
        tmp_path, JOB, step, done=1, most=2, who="train", left=("node2", "node3")
    )
    assert cause == (
        "node[2-3] left the job: its node failed, and the job (--no-kill) goes on with the "
        "nodes left"
    )
    assert said == (
        f"train: starting the step again in job 42 on the nodes left (restart 2 of at most 2), "
        f"with no checkpoint in its model directory: {cause}"
    )
    said, cause = what_follows.after_failure(
        tmp_path, JOB, step, done=2, most=2, who="train", left=("node2",)
    )
    assert cause is None and said.endswith("restart(s) (--max_restarts)")


def test_srun_refuses_what_it_cannot_run_in_one_line() -> None:
    """Outside a batch job, without --model_dir or without a command: exit 2, one line that
    names what is missing, nothing run."""
    cases = {
        ("--model_dir=/tmp/x", "--", "hostname"): ({}, "SLURM_JOB_ID: is not set"),
        ("--", "hostname"): ({"SLURM_JOB_ID": "5"}, "--model_dir: is required"),
        ("--model_dir=/tmp/x",): ({"SLURM_JOB_ID": "5"}, "COMMAND: missing"),
    }
    for arguments, (environ, said) in cases.items():
        ran = subprocess.run(
            [sys.executable, "-m", "tfconfig_slurm.commands", "srun", *arguments],
            env={"PATH": os.environ["PATH"], **environ},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert ran.returncode == 2, ran
        assert len(ran.stderr.splitlines()) == 1 and said in ran.stderr, ran.stderr


def test_a_job_that_goes_on_without_a_failed_node_asks_for_as_many_nodes_but_never_it() -> None:
    """Its record, once Slurm ended it for node2, counts node1 alone; its --nodelist named
    node2, and the new job would wait for it for ever."""
    held = Allocation(("node1", "node2"), (2, 2), (2, 2))
    record = {"NumNodes": "1", "ReqNodeList": "node[1-2]", "ExcNodeList": "node7", "Requeue": "0"}
    asked = restarts.without(record, held, ("node2",))
    assert asked == {**record, "NumNodes": "2", "ReqNodeList": "", "ExcNodeList": "node[2,7]"}
    unpinned = {**record, "ReqNodeList": "(null)", "ExcNodeList": "(null)"}
    assert restarts.without(unpinned, held, ("node2",))["ExcNodeList"] == "node2"
    assert restarts.without(unpinned, held, ("node2",))["ReqNodeList"] == "(null)"


@pytest.mark.parametrize(
    ("srun_args", "sized"),
    [
        (["--kill-on-bad-exit=1", "--ntasks-per-node=2", "python", "-n", "4"], None),
        (["-N", "2", "python", "train.py"], "-N"),
        (["-N2", "python"], "-N2"),
        (["--cpu-bind=none", "--nodelist=node[1-2]", "bash"], "--nodelist=node[1-2]"),
        (["-o", "log", "-w", "node1", "bash"], "-w"),
        (["--output=log", "python", "--nodes=2"], None),
    ],
)
def test_srun_options_that_size_a_step_by_nodes_or_tasks_are_found_before_its_command(
    srun_args: list[str], sized: str | None
) -> None:
    """Such a step cannot start again on the nodes left; the command's own words do not
    count."""
    assert restarts.sized_by(srun_args) == sized


def test_the_watch_starts_at_a_task_s_end_or_a_node_s_failure_and_sees_nodes_gone() -> None:
    assert restarts.ended("srun: error: node1: tasks 0-1: Exited with exit code 3\n")
    assert restarts.ended("slurmstepd-node1: error: *** JOB 53 ON node1 CANCELLED AT x DUE "
                            "TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***")  # fmt: skip
    assert not restarts.ended("srun: Job 18 step creation temporarily disabled, retrying")
    assert restarts.gone(("node1", "node2"), ("node1",)) == ("node2",)
    # slurmctld could not say: nothing is known gone.
    assert restarts.gone(("node1", "node2"), None) == ()

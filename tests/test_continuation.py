"""A job that may not requeue itself goes on in a new one: what is carried from `scontrol show
job` into the new submission, and what is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import REPOSITORY
from tfconfig_slurm.cluster.step import CONTINUATION
from tfconfig_slurm.process import continuation

# A running job of the test cluster: `sbatch --nodelist=node[2-3] --nodes=2
# --ntasks-per-node=2 --gres=gpu:1 launch/train.sbatch --log_every_steps=10 --train_steps=20`.
RECORD = (
    (Path(__file__).parent / "fixtures" / "scontrol-show-job.txt")
    .read_text()
    .replace("@REPOSITORY@", str(REPOSITORY))
)


def parsed(text: str) -> dict[str, str]:
    return continuation.parse_record(text)


def test_the_record_s_command_keeps_its_arguments_and_each_field_its_value() -> None:
    record = parsed(RECORD)
    assert record["Command"].endswith("launch/train.sbatch --log_every_steps=10 --train_steps=20")
    assert (record["NtasksPerN:B:S:C"], record["CPUs/Task"]) == ("2:0:*:*", "1")
    assert (record["TresPerNode"], record["Requeue"], record["Account"]) == (
        "gres:gpu:1",
        "1",
        "(null)",
    )


def test_the_new_job_asks_for_what_this_one_has() -> None:
    options = continuation.resources(parsed(RECORD))
    assert options == [
        "--job-name=mnist_deep",
        "--chdir=/tmp/pytest-of-root/pytest-41/popen-gw1/test_two_jobs_on_the_same_node0",
        "--nodes=2",
        "--ntasks=4",
        "--cpus-per-task=1",
        "--time=365-00:00:00",
        "--partition=debug",
        "--nodelist=node[2-3]",
        "--ntasks-per-node=2",
        "--gres=gpu:1",
    ]


def test_an_array_task_goes_on_as_the_same_index() -> None:
    """A sweep's run: its index picks its line of the sweep file (--sweep_file), in the new
    job as in this one."""
    record = parsed(RECORD.replace(" JobName=", " ArrayJobId=41 ArrayTaskId=3 JobName="))
    assert continuation.resources(record)[-1] == "--array=3"
    assert "--array" not in " ".join(continuation.resources(parsed(RECORD)))


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
        (str(REPOSITORY), "/nowhere", "batch script '/nowhere/launch/train.sbatch' is not there"),
    ],
)
def test_what_cannot_go_on_says_why(old: str, new: str, why: str) -> None:
    assert why in continuation.check(parsed(RECORD.replace(old, new)))


def test_a_job_that_can_go_on_has_nothing_against_it() -> None:
    assert continuation.check(parsed(RECORD)) == ""

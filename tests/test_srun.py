"""`tfconfig-slurm srun`, the one line of a user's batch script that starts a failed step again
in its job, on the test cluster with steps of bash (no TensorFlow): a task killed once, then a
finished step; an exit of the code's own, and a script under with-tfconfig that raises, not
started again; a task killed at every try, started again until --max_restarts, and a try that
trained nothing not started again; a command's exit 4, which stopped no run, a failure; a step
told to stop (SIGTERM, SIGHUP), not started again; SIGUSR1 and SIGUSR2 to the batch script,
passed on to the tasks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli import REPOSITORY, wait_until
from tests.slurm_cluster import CALL_SECONDS, SlurmCluster, wait_for_end

WITH_TFCONFIG = REPOSITORY / "launch" / "with-tfconfig"
# Rank 1 of the step, as each case has it: its step's try counted in tries (one line a try).
# Told to stop, a task of "stopped" dies of SIGKILL, as one that does not stop in time would;
# a task of "usr1" ends well on SIGUSR1.
STEP = r"""
case=$1; tries=$PWD/$case/tries
[[ $case == stopped || $case == hup ]] && trap 'kill -9 $$' TERM HUP
[[ $case == usr1 ]] && trap 'echo usr1 >"$PWD/$case/warned"; exit 0' USR1
[[ $case == usr2 ]] && trap 'echo usr2 >"$PWD/$case/warned"; exit 0' USR2
if [[ $SLURM_PROCID == 1 ]]; then
  echo try >>"$tries"
  try=$(wc -l <"$tries")
  # A checkpoint of a later step each try: the try trained.
  index="model_checkpoint_path: \"model.ckpt-$((try * 10))\""
  [[ $case == always ]] && echo "$index" >"$PWD/$case/checkpoint"
  case $case in
    once) ((try > 1)) || kill -9 $$ ;;
    always) kill -9 $$ ;;
    bug) exit 1 ;;
    four) exit 4 ;;
    untrained) kill -9 $$ ;;
  esac
fi
# A script of the user's that raises, under with-tfconfig told the same model directory.
[[ $case == raising ]] &&
  exec "$WITH_TFCONFIG" --model_dir="$PWD/$case" python3 -c 'raise ValueError("bad example")'

if [[ $case == stopped || $case == hup || $case == usr1 || $case == usr2 ]]; then
  sleep 60 &
  wait
fi
sleep 1
"""
# A second argument is one more option for srun.
BATCH = """#!/bin/bash
#SBATCH --nodes=1 --ntasks-per-node=2 --output=%x.out
exec tfconfig-slurm srun --model_dir="$PWD/$1" -- ${2:+"$2"} bash "$PWD/step.sh" "$1"
"""


@pytest.mark.slurm
def test_a_killed_task_starts_the_step_again_in_the_job_and_a_bug_does_not(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "step.sh").write_text(f"WITH_TFCONFIG={WITH_TFCONFIG}\n{STEP}")
    (tmp_path / "job.sbatch").write_text(BATCH)
    cases = ("once", "bug", "four", "always", "untrained", "raising", "refused")
    jobs = {}
    for case in cases:
        jobs[case] = submitted(slurm_cluster, tmp_path, case, *(["--bogus"] * (case == "refused")))
    ended = {case: wait_for_end(slurm_cluster, job) for case, job in jobs.items()}
    said = {case: (tmp_path / f"{case}.out").read_text() for case in cases}
    tries = {
        case: len(tried.read_text().splitlines()) if (tried := tmp_path / case / "tries").exists()
        else 0
        for case in cases
    }  # fmt: skip
    restarts = {
        case: [each["cause"] for each in json.loads(state.read_text()).get("restarts", [])]
        if (state := tmp_path / case / "state.json").exists()
        else []
        for case in cases
    }
    states = {case: ended[case]["JobState"] for case in cases}
    assert states == {
        "once": "COMPLETED", "bug": "FAILED", "four": "FAILED", "always": "FAILED",
        "untrained": "FAILED", "raising": "FAILED", "refused": "FAILED",
    }, said  # fmt: skip
    assert tries == {
        "once": 2, "bug": 1, "four": 1, "always": 3, "untrained": 2, "raising": 1, "refused": 0,
    }, said  # fmt: skip
    assert restarts == {
        "once": ["a task was killed"],
        "bug": [],
        "four": [],
        "always": ["a task was killed"] * 2,
        "untrained": ["a task was killed"],
        "raising": [],
        "refused": [],
    }, said
    job = jobs["once"]
    assert re.search(
        rf"tfconfig-slurm srun: the step failed \(exit 137\); first to fail: \S+: task 1: Killed"
        rf"(?s:.*)tfconfig-slurm srun: starting the step again in job {job} \(restart 1 of at "
        r"most 2\), with no checkpoint in its model directory: a task was killed",
        said["once"],
    ), said["once"]
    assert said["bug"].count("the step failed") == 1
    assert (
        "tfconfig-slurm srun: not starting the step again: srun names no task killed" in said["bug"]
    )
    # #52: exit 4 is the runtime's "stopped, not requeued" only where the run says it stopped.
    assert said["four"].endswith(
        "tfconfig-slurm srun: not starting the step again: srun names no task killed, only one "
        "that ended: Exited with exit code 4\n"
    ), said["four"]
    assert said["always"].endswith(
        "tfconfig-slurm srun: not starting the step again: a task was killed, and the job made its "
        "2 restart(s) (--max_restarts)\n"
    ), said["always"]
    assert said["untrained"].endswith(
        "tfconfig-slurm srun: not starting the step again: it failed before it trained a step\n"
    ), said["untrained"]
    # From with-tfconfig's record of the script that raised: its own error, not retried.
    assert re.search(
        r"first to fail: (ps|chief) 0 on \S+: its command failed: ValueError: bad example "
        r"\(exit 1\)(?s:.*)"
        r"tfconfig-slurm srun: not starting the step again: an error in the run's code\n$",
        said["raising"],
    ), said["raising"]
    # srun refused its options: its own line says why (it names itself as it was called).
    assert (
        "the step failed (exit 255) with no task named: srun's own last line: srun: "
        "unrecognized option '--bogus'"
    ) in said["refused"], said["refused"]


def submitted(cluster: SlurmCluster, workdir: Path, case: str, *srun_option: str) -> str:
    """The job of `case`, submitted from `workdir` (which holds step.sh and job.sbatch)."""
    (workdir / case).mkdir()
    return cluster.sbatch(workdir, f"--job-name={case}", "job.sbatch", case, *srun_option)


@pytest.mark.slurm
def test_a_step_told_to_stop_is_not_started_again_and_sigusr1_reaches_the_tasks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """scancel --full --signal=TERM (or HUP): every task dies of SIGKILL, which alone would be
    worth a restart, and the batch script says it was told to stop and starts nothing. SIGUSR1
    or SIGUSR2 to the batch script alone (scancel --batch, as #SBATCH --signal=B:USR1@90 sends
    it) reaches the tasks through srun, which end well, and the job completes."""
    (tmp_path / "step.sh").write_text(STEP)
    (tmp_path / "job.sbatch").write_text(BATCH)
    how = {
        "stopped": "--full --signal=TERM",
        "hup": "--full --signal=HUP",
        "usr1": "--batch --signal=USR1",
        "usr2": "--batch --signal=USR2",
    }
    jobs = {case: submitted(slurm_cluster, tmp_path, case) for case in how}
    assert wait_until(
        lambda: all((tmp_path / case / "tries").exists() for case in jobs), CALL_SECONDS
    )
    for case, job in jobs.items():
        signalled = slurm_cluster.run(["scancel", *how[case].split(), job])
        assert signalled.returncode == 0, signalled.stderr
    ended = {case: wait_for_end(slurm_cluster, job) for case, job in jobs.items()}
    said = {case: (tmp_path / f"{case}.out").read_text() for case in jobs}
    for case, signal in (("stopped", "SIGTERM"), ("hup", "SIGHUP")):
        assert ended[case]["JobState"] != "COMPLETED", said
        assert said[case].endswith(
            f"tfconfig-slurm srun: told to stop ({signal}): the step is not started again\n"
        ), said[case]
        assert (tmp_path / case / "tries").read_text() == "try\n"
        assert not (tmp_path / case / "state.json").exists()
    for case in ("usr1", "usr2"):
        assert ended[case]["JobState"] == "COMPLETED", said[case]
        assert (tmp_path / case / "warned").read_text() == f"{case}\n"

"""launch/sweep checked without submitting (--dry_run), and `tfconfig-slurm runs` over run
directories as the runtime leaves them; the SLURM runs of both are in tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.cli import REPOSITORY, run_module
from tests.slurm_cluster import SlurmCluster
from tests.slurm_envs import task_env
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import claim, history
from tfconfig_slurm.process.records.claim import Holder
from tfconfig_slurm.process.user_code.experiment import swept, with_overrides

SWEEP = REPOSITORY / "launch" / "sweep"
THREE = """# learning rates
learning_rate=0.001

learning_rate=0.002,dropout=0.3
learning_rate=0.004
"""


def test_a_line_sets_in_place_of_the_hparams_flag_and_a_repeat_within_one_is_refused() -> None:
    defaults = {"learning_rate": 0.1, "dropout": 0.5}
    line = swept("learning_rate=0.01,dropout=0.3", "learning_rate=0.2")
    assert with_overrides(defaults, line) == {"learning_rate": 0.2, "dropout": 0.3}
    assert swept("", "dropout=0.1") == "dropout=0.1"
    assert swept("dropout=0.1", "") == "dropout=0.1"
    with pytest.raises(UsageError, match="sets dropout twice"):
        with_overrides(defaults, swept("", "dropout=0.1,dropout=0.2"))


def test_a_numpy_default_takes_a_number_of_its_kind() -> None:
    import numpy as np  # noqa: PLC0415

    defaults = {"learning_rate": np.float64(0.1), "units": np.int64(8)}
    values = with_overrides(defaults, "learning_rate=0.2,units=16")
    assert values == {"learning_rate": 0.2, "units": 16}
    assert (type(values["learning_rate"]), type(values["units"])) == (float, int)


def test_a_bool_default_takes_true_or_false_never_a_number() -> None:
    """bool is a number to Python: a bool hparam was once read as a float ('flag=0' gave 0.0)."""
    defaults = {"augment": True, "rate": 0.5}
    assert with_overrides(defaults, "augment=false") == {"augment": False, "rate": 0.5}
    assert with_overrides(defaults, "augment=Yes")["augment"] is True
    with pytest.raises(UsageError, match=r"sets augment='2.5', expected true or false"):
        with_overrides(defaults, "augment=2.5")


# An Estimator experiment that imports no TensorFlow, with mnist_deep's hparams and their
# check: what the sweep reads of it is its source and HPARAMS, and calls check_hparams.
NO_TENSORFLOW = (
    "from tfconfig_slurm.experiments.mnist_data import check_hparams\n"
    "HPARAMS = {'learning_rate': 0.1, 'dropout': 0.5}\n"
    "def model_fn(features, labels, mode, params): pass\n"
    "def input_fn(mode, params): pass\n"
)


def sweep(tmp_path: Path, text: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """launch/sweep of `text` as three.sweep; of NO_TENSORFLOW's model.py unless `arguments`
    name an experiment (the sweep loads the experiment: mnist_deep would start TensorFlow)."""
    (tmp_path / "three.sweep").write_text(text)
    (tmp_path / "model.py").write_text(NO_TENSORFLOW)
    if not any(argument.startswith("--experiment") for argument in arguments):
        arguments = (*arguments, "--experiment=model.py")
    return subprocess.run(
        [str(SWEEP), *arguments],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_sweep_is_one_array_task_a_line_reading_its_kept_lines(tmp_path: Path) -> None:
    result = sweep(
        tmp_path, THREE, "--dry_run", "--max_running=2", "--sbatch_option=--nodes=1",
        "three.sweep", "--train_steps=10", "--output_root=out",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = result.stdout.split()
    assert command[:6] == [
        "sbatch", "--parsable", "--array=0-2%2", "--job-name=three", "--output=three-%A_%a.out",
        "--nodes=1",
    ]  # fmt: skip
    assert command[6] == str(REPOSITORY / "launch" / "train.sbatch")
    assert command[7:] == [
        "--train_steps=10",
        "--output_root=out",
        "--experiment=model.py",
        f"--sweep_file={tmp_path}/out/sweeps/three.txt",
    ]
    # A dry run submits nothing and keeps nothing.
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("left", "said"),
    [
        ('model_checkpoint_path: "ckpt-101"', "whose latest checkpoint (ckpt-101) is tf-keras's"),
        ('{"experiment": "other", "state": "done"}', "a run of 'other', not of 'model'"),
    ],
    ids=["other backend", "other experiment"],
)
def test_a_line_whose_run_directory_every_task_would_refuse_stops_the_sweep(
    tmp_path: Path, left: str, said: str
) -> None:
    """Checked as each array task checks its directory, but before anything is submitted;
    the fix named is a sweep's, not --experiment_id's, which a sweep sets itself."""
    run = tmp_path / "out" / "three-2"
    run.mkdir(parents=True)
    if left.startswith("{"):
        (run / "state.json").write_text(left)
    else:
        (run / "checkpoint").write_text(left + "\n")
        (run / "ckpt-101.index").write_bytes(history.TABLE_MAGIC)
    result = sweep(
        tmp_path, THREE, "--dry_run", "three.sweep", "--experiment=model.py", "--output_root=out"
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"sweep: SWEEP_FILE: names out/three-2, {said}"), line
    assert line.endswith("HINT: give the sweep a file name of its own: its runs are named after "
                         "it (three-0, three-1, ...)"), line  # fmt: skip
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["three-2"]


def test_a_sweep_sbatch_refused_keeps_no_lines_and_its_retry_is_not_blocked(
    tmp_path: Path, slurm_cluster: SlurmCluster
) -> None:
    # The test cluster's sbatch, without its SLURM_CONF (the environment below has none),
    # finds no controller and refuses, as on a login node set up wrongly.
    refused = sweep(tmp_path, THREE, "three.sweep", "--train_steps=10", "--output_root=out")
    assert refused.returncode == 2, refused.stderr
    said = refused.stderr.splitlines()[-1]
    assert said.startswith("sweep: sbatch: refused the array (exit 1), so nothing was submitted")
    assert "HINT: fix what they name" in said
    assert not (tmp_path / "out").exists()  # neither the lines nor the folders made for them
    retry = sweep(tmp_path, "learning_rate=0.1\n", "three.sweep", "--output_root=out")
    assert retry.returncode == 2, retry.stderr
    assert "submitted before" not in retry.stderr


@pytest.mark.parametrize("name", ["my lr.sweep", ".sweep"])
def test_a_sweep_file_whose_name_cannot_name_runs_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text(THREE)
    result = sweep(tmp_path, THREE, name, "--output_root=out", "--dry_run")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"sweep: SWEEP_FILE: is named '{Path(name).stem}'")
    assert not (tmp_path / "out").exists()


def test_an_output_root_that_cannot_hold_the_sweep_is_refused_even_in_a_dry_run(
    tmp_path: Path,
) -> None:
    (tmp_path / "afile").write_text("a file\n")
    result = sweep(tmp_path, THREE, "three.sweep", "--output_root=afile", "--dry_run")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"sweep: --output_root: cannot hold {tmp_path}/afile/sweeps: {tmp_path}/afile is a "
        "file, not a directory. HINT: choose a writable directory with room, e.g. "
        "--output_root=/scratch/$USER/tf-output\n"
    )


def test_a_dry_run_prints_a_command_a_shell_runs_as_is(tmp_path: Path) -> None:
    result = sweep(tmp_path, THREE, "three.sweep", "--output_root=my runs", "--dry_run")
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout)[-1] == f"--sweep_file={tmp_path}/my runs/sweeps/three.txt"


def test_the_sweep_s_own_flags_after_the_file_are_the_sweep_s(tmp_path: Path) -> None:
    """Not passed on to the runtime, which does not know them (its array tasks failed so)."""
    result = sweep(
        tmp_path, THREE, "three.sweep", "--train_steps=10", "--max_running", "2",
        "--sbatch_option", "--nodes=1", "--output_root=out", "--dry_run",
        "--sbatch_option=--ntasks-per-node=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = result.stdout.split()
    assert command[:7] == [
        "sbatch", "--parsable", "--array=0-2%2", "--job-name=three", "--output=three-%A_%a.out",
        "--nodes=1", "--ntasks-per-node=2",
    ]  # fmt: skip
    assert command[8:] == [
        "--train_steps=10",
        "--output_root=out",
        "--experiment=model.py",
        f"--sweep_file={tmp_path}/out/sweeps/three.txt",
    ]


@pytest.mark.parametrize(
    ("text", "arguments", "culprit"),
    [
        (
            "learning_rate=0.001\nlearnin_rate=2\n",
            (),
            "run 1 ('learnin_rate=2'): sets 'learnin_rate'",
        ),
        ("learning_rate=fast\n", (), "run 0 ('learning_rate=fast'): sets learning_rate='fast'"),
        ("dropout=0.3\ndropout=1.5\n", (), "run 1 ('dropout=1.5'): sets dropout=1.5, expected"),
        ("# nothing\n\n", (), "SWEEP_FILE: three.sweep has no lines"),
        (THREE, ("--experiment_id=x",), "--experiment_id: is the sweep's to set"),
        (THREE, ("--train_steps=ten",), "--train_steps: is 'ten', expected a whole number"),
        (
            THREE,
            ("--max_running=0",),
            "--max_running: is '0', expected a positive integer. HINT: launch/sweep --help",
        ),
        (
            THREE,
            ("--trian_steps=5",),
            "--trian_steps: is not a flag of tfconfig-slurm-run; did you mean --train_steps? HINT",
        ),
        (THREE, ("--sbatch_option=nodes=1",), "--sbatch_option: is 'nodes=1', not an sbatch"),
        (THREE, ("--sbatch_option=--array=0-9",), "--sbatch_option: sets --array, which"),
        (THREE, ("--sbatch_option=-a0-9",), "--sbatch_option: sets -a0-9, which"),
        # The runtime's flags, parsed again by the sweep: absl's plain ValueError as well.
        (THREE, ("--noall_reduce=1",), "--noall_reduce: is given a value ('1'), but it only"),
        # Once submitted an array whose every run made a directory named by the help's text.
        (THREE, ("--help",), "--help: comes among the runtime flags after SWEEP_FILE, which go"),
    ],
)
def test_a_bad_sweep_is_refused_before_anything_is_submitted(
    tmp_path: Path, text: str, arguments: tuple[str, ...], culprit: str
) -> None:
    result = sweep(tmp_path, text, "three.sweep", "--output_root=out", *arguments)
    assert result.returncode == 2
    assert result.stderr.startswith("sweep: "), result.stderr
    assert culprit in result.stderr
    assert "HINT:" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def run_dir(
    root: Path, name: str, state: Mapping[str, Any], summary: Mapping[str, Any] | None, step: int
) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(state))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "model.ckpt-{step}"\n')
    return folder


def test_the_runs_table_names_the_attempt_s_own_first_failure_recorded_before_it_started(
    tmp_path: Path,
) -> None:
    """A with-tfconfig worker whose script failed at once recorded it 40 ms before the chief
    wrote its attempt's start (seen on the test cluster): the attempt's own record (by its run
    id) is its first failure all the same; an earlier attempt's is not."""
    started = time.time()
    first = {"task": "worker 0", "node": "node2", "what": "ValueError: bad thing",
             "exit_status": 1, "seen_by": None, "time": started - 0.04}  # fmt: skip
    for name, run in (("quick", "3.0.0"), ("earlier", "4.0.0")):
        state = {"state": "failed", "run": run, "attempts": [{"started": started}]}
        folder = run_dir(tmp_path, name, state, None, 0)
        (folder / "failures").mkdir()
        (folder / "failures" / "3.0.0.json").write_text(json.dumps(first))
    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--json")
    assert table.returncode == 0, table.stderr
    assert {run["experiment_id"]: run["first_failure"] for run in json.loads(table.stdout)} == {
        "quick": "worker 0 on node2: ValueError: bad thing (exit 1)",
        "earlier": None,
    }


def test_the_runs_table_says_each_run_s_state_from_what_it_wrote(tmp_path: Path) -> None:
    hparams = {"learning_rate": 0.001}
    done = {"state": "done", "hparams": hparams, "job_id": None}
    summary = {"eval": {"accuracy": 0.9, "loss": 0.3, "global_step": 50.0},
               "trainers": [{"examples_per_sec": 100.0}, {"examples_per_sec": 50.5}]}  # fmt: skip
    # Its step started again in its latest job once (launch/train.sbatch), and once in an
    # earlier job's, which its table line does not count.
    restarts = [
        {"job_id": "6", "cause": "a task was killed", "time": 1},
        {"job_id": "7", "cause": "worker 0 stopped answering", "time": 2},
    ]
    run_dir(tmp_path, "a-done", done | {"job_id": "7", "restarts": restarts}, summary, 50)
    # Resumed with nothing left to train: its trainer took no step.
    better = {"eval": {"accuracy": 0.95, "loss": 0.2, "global_step": 50.0},
              "trainers": [{"examples_per_sec": 0.0}]}  # fmt: skip
    run_dir(tmp_path, "b-done", done | {"hparams": {"learning_rate": 0.002}}, better, 50)
    running = run_dir(tmp_path, "c-running", {"state": "running", "hparams": hparams}, None, 20)
    claim.claim(running, claim.this_holder(None))
    # It logged step 35 since its checkpoint of step 20: the step it is at.
    (running / "progress.json").write_text(json.dumps({"global_step": 35, "time": time.time()}))
    # A stopped run's step is its checkpoint's, whatever it logged.
    stopped_early = run_dir(
        tmp_path, "e-stopped", {"state": "stopped", "signal": "SIGUSR1"}, None, 40
    )
    (stopped_early / "progress.json").write_text(
        json.dumps({"global_step": 47, "time": time.time()})
    )
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    failed = run_dir(tmp_path, "d-failed", {"state": "running", "hparams": hparams}, None, 30)
    claim.claim(failed, Holder(job=None, host=os.uname().nodename, pid=int(dead.stdout)))
    (failed / "failures").mkdir()
    first = {"task": "worker 1", "node": "node2", "what": "ValueError: bad batch",
             "exit_status": 1, "seen_by": None, "time": time.time()}  # fmt: skip
    (failed / "failures" / "7.0.0.json").write_text(json.dumps(first))
    # A local cluster whose launcher removed its lock without a failure, its chief's word lost
    # (it was killed in a stop it could not take): it no longer trains.
    run_dir(tmp_path, "d-silent", {"state": "running", "hparams": hparams}, None, 10)
    # A local cluster's launcher removes its lock as it stops the tasks a failure left.
    unlocked = run_dir(tmp_path, "d-unlocked", {"state": "running", "hparams": hparams}, None, 5)
    (unlocked / "failures").mkdir()
    (unlocked / "failures" / "local.json").write_text(json.dumps(first | {"task": "ps 0"}))
    stopped = {"state": "stopped", "signal": "SIGUSR1", "why": "time limit", "job_id": "41",
               "attempts": [{"started": time.time() - 60}]}  # fmt: skip
    continued = run_dir(tmp_path, "f-continued", stopped, None, 60)
    (continued / "continued.json").write_text('{"job_id": "42", "after": "41", "time": 1e10}')
    (tmp_path / "not-a-run").mkdir()

    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--sort=loss", "--json")
    assert table.returncode == 0, table.stderr
    runs = json.loads(table.stdout)
    assert [(run["experiment_id"], run["state"], run["global_step"]) for run in runs] == [
        ("b-done", "done", 50),
        ("a-done", "done", 50),
        ("c-running", "running", 35),
        ("d-failed", "failed", 30),
        ("d-silent", "failed", 10),
        ("d-unlocked", "failed", 5),
        ("e-stopped", "stopped", 40),
        ("f-continued", "stopped", 60),
    ]
    assert runs[1]["eval"]["accuracy"] == 0.9 and runs[1]["examples_per_sec"] == 150.5
    assert [run["restarts"] for run in runs[:2]] == [[], ["worker 0 stopped answering"]]
    assert runs[0]["hparams"] == {"learning_rate": 0.002} and runs[0]["examples_per_sec"] is None
    assert {"experiment_id", "state", "global_step", "hparams", "eval", "job_id"} <= set(runs[0])
    assert [run["first_failure"] for run in runs] == [
        None, None, None, "worker 1 on node2: ValueError: bad batch (exit 1)", None,
        "ps 0 on node2: ValueError: bad batch (exit 1)", None, None
    ]  # fmt: skip
    assert [run["stopped_by"] for run in runs][-2:] == ["SIGUSR1", "time limit"]
    assert [run["continued_as"] for run in runs][-2:] == [None, "42"]
    text = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--sort=accuracy")
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["EXPERIMENT_ID", "STATE", "STEP", "EVAL"]
    assert lines[1].startswith("b-done") and "accuracy=0.95" in lines[1]
    assert "done (restarted 1x in its job: worker 0 stopped answering)" in lines[2], lines[2]
    assert lines[-2:] == [
        "d-failed: first to fail: worker 1 on node2: ValueError: bad batch (exit 1)",
        "d-unlocked: first to fail: ps 0 on node2: ValueError: bad batch (exit 1)",
    ]
    continued_line = next(line for line in lines if line.startswith("f-continued"))
    assert "41 -> 42" in continued_line and "(time limit)" in continued_line
    assert next(line for line in lines if line.startswith("e-stopped")).split()[1:3] == [
        "stopped",
        "(SIGUSR1)",
    ]


def test_a_run_s_standing_in_one_line_as_a_job_s_out_ends(tmp_path: Path) -> None:
    """`runs --run DIR`, which launch/train.sbatch prints last: how the run ended, its few
    main metrics (an Estimator classifier reports 11), and where its summary and logs are."""
    metrics = {"accuracy": 0.99, "loss": 0.03, "auc": 0.999, "precision": 0.98,
               "recall": 0.97, "average_loss": 0.02, "label/mean": 0.5,
               "global_step": 400.0}  # fmt: skip
    done = run_dir(tmp_path, "done", {"state": "done"}, {"eval": metrics}, 400)
    (done / "logs").mkdir()
    said = run_module("tfconfig_slurm.commands", "runs", f"--run={done}")
    assert said.returncode == 0, said.stderr
    assert said.stdout == (
        f"{done}: done at step 400: accuracy=0.99,auc=0.999,average_loss=0.02,loss=0.03; "
        f"summary in {done}/summary.json; task logs in {done}/logs\n"
    )
    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path)).stdout.splitlines()
    assert "accuracy=0.99,auc=0.999,average_loss=0.02,loss=0.03 " in table[1], table
    stopped = {"state": "stopped", "signal": "SIGUSR1", "why": "time limit"}
    halted = run_dir(tmp_path, "halted", stopped, None, 40)
    # A run trained in one process has no task logs to point to.
    assert run_module("tfconfig_slurm.commands", "runs", f"--run={halted}").stdout == (
        f"{halted}: stopped at step 40 (time limit) with a checkpoint; run it again with the "
        "same experiment id to resume\n"
    )
    # A job refused before it trained leaves no run in its directory, the batch script's
    # logs/ at most.
    nothing = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path / 'refused'}")
    assert nothing.returncode == 2
    assert f"--run: is '{tmp_path / 'refused'}', which is no directory" in nothing.stderr
    (tmp_path / "refused" / "logs").mkdir(parents=True)
    nothing = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path / 'refused'}")
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout == (
        f"{tmp_path / 'refused'}: no run has started here, nothing was trained; task logs in "
        f"{tmp_path / 'refused'}/logs\n"
    )
    # A command under with-tfconfig that saved no checkpoint and wrote no summary.json.
    script = tmp_path / "script"
    script.mkdir()
    (script / "state.json").write_text(json.dumps({"state": "done"}))
    assert run_module("tfconfig_slurm.commands", "runs", f"--run={script}").stdout == (
        f"{script}: done (no checkpoint)\n"
    )
    (script / "state.json").write_text(json.dumps({"state": "stopped", "signal": "SIGTERM"}))
    assert run_module("tfconfig_slurm.commands", "runs", f"--run={script}").stdout == (
        f"{script}: stopped (SIGTERM) with no checkpoint\n"
    )
    failed = run_dir(tmp_path, "failed", {"state": "failed"}, None, 220)
    assert run_module("tfconfig_slurm.commands", "runs", f"--run={failed}").stdout.startswith(
        f"{failed}: failed (its latest checkpoint is at step 220); first to fail: "
    )
    # An output root is no run: said so, not "no run has started here".
    root = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path}")
    assert root.returncode == 2
    assert root.stderr.strip().endswith(
        f"--run: is '{tmp_path}', an output root of 4 run(s) (done, failed, halted, ...), not a "
        f"run's model directory. HINT: give one of them, e.g. --run={tmp_path / 'done'}, or "
        f"list those of its output root: tfconfig-slurm runs {tmp_path}"
    ), root.stderr
    # Runs only a level deeper (a sweep's, in its own output root): the table that lists
    # them is that output root's, not this folder's, which lists none.
    sweep = tmp_path / "outer" / "sweep"
    sweep.mkdir(parents=True)
    (tmp_path / "done").rename(sweep / "done")
    nested = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path / 'outer'}")
    assert nested.returncode == 2
    assert nested.stderr.strip().endswith(
        f"or list those of its output root: tfconfig-slurm runs {sweep}"
    ), nested.stderr


def test_a_run_s_last_update_moves_with_its_logged_step_and_one_that_wrote_nothing_has_none(
    tmp_path: Path,
) -> None:
    """A run between checkpoints (Estimator's are 10 minutes apart) logs its step to
    progress.json: its update is that, not its last checkpoint's. A step whose tasks failed at
    their start left only its failure record."""
    running = run_dir(tmp_path, "training", {"state": "running"}, None, 20)
    hour_ago = time.time() - 3600
    for name in ("state.json", "checkpoint"):
        os.utime(running / name, (hour_ago, hour_ago))
    (running / "progress.json").write_text(json.dumps({"global_step": 35, "time": time.time()}))
    failed = tmp_path / "failed-at-start" / "failures"
    failed.mkdir(parents=True)
    first = {"task": "chief 0", "node": "node3", "what": "refused", "exit_status": 2,
             "seen_by": None, "time": time.time()}  # fmt: skip
    (failed / "7.0.0.json").write_text(json.dumps(first))
    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--json")
    assert table.returncode == 0, table.stderr
    updated = {run["experiment_id"]: run["updated"] for run in json.loads(table.stdout)}
    assert updated["training"] == (running / "progress.json").stat().st_mtime
    assert updated["failed-at-start"] is None
    shown = run_module("tfconfig_slurm.commands", "runs", str(tmp_path))
    assert "d ago" not in shown.stdout, shown.stdout


def test_the_runs_table_refuses_an_unknown_metric_and_a_missing_root(tmp_path: Path) -> None:
    run_dir(tmp_path, "a", {"state": "done"}, {"eval": {"accuracy": 0.9}}, 5)
    unknown = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--sort=acc")
    assert unknown.returncode == 2
    assert "--sort: is 'acc', which no finished run reports" in unknown.stderr
    missing = run_module("tfconfig_slurm.commands", "runs", str(tmp_path / "none"))
    assert missing.returncode == 2 and "OUTPUT_ROOT:" in missing.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--settle=5",), "--settle: goes with --run"),
        (("--run=RUN", "--json"), "--json: goes with the table of runs, not --run's one line"),
        (("--run=RUN", "--sort=loss"), "--sort: goes with the table of runs"),
        # An unset variable's: --run= read the current folder as an output root.
        (("--run=",), "--run: is '': empty, as from a variable that is unset"),
        (("--sort=",), "--sort: is '': empty, as from a variable that is unset"),
    ],
)
def test_a_runs_flag_without_the_one_it_goes_with_is_one_line(
    tmp_path: Path, flags: tuple[str, ...], said: str
) -> None:
    run_dir(tmp_path, "a", {"state": "done"}, {"eval": {"loss": 0.1}}, 5)
    given = [flag.replace("RUN", str(tmp_path / "a")) for flag in flags]
    refused = run_module("tfconfig_slurm.commands", "runs", *given, str(tmp_path))
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr.count("\n") == 1 and said in refused.stderr, refused.stderr


def test_the_runs_table_says_a_run_whose_files_it_cannot_read_is_unreadable(
    tmp_path: Path,
) -> None:
    """Edited, cut short or another program's: a line that says so, not a traceback, and not
    a run left out without a word."""
    run_dir(tmp_path, "good", {"state": "done"}, {"eval": {"accuracy": 0.9}}, 5)
    run_dir(tmp_path, "typed", {"state": "done", "hparams": [1]}, {}, 5)
    run_dir(tmp_path, "summed", {"state": "done"}, {"trainers": 3}, 5)
    run_dir(tmp_path, "listed", {"state": "done"}, {"eval": [1, 2]}, 5)
    # A step in words, where no checkpoint says the step.
    (
        run_dir(tmp_path, "worded", {"state": "done", "global_step": "x"}, {}, 5) / "checkpoint"
    ).unlink()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "state.json").write_text("{garbage")
    # Beside a checkpoint and a summary that would make it done: the run's job and hparams
    # are in the file that cannot be read.
    run_dir(tmp_path, "edited", {}, {"eval": {"accuracy": 0.9}}, 5).joinpath(
        "state.json"
    ).write_text("{bad")
    run_dir(tmp_path, "arrayed", {"state": "done"}, None, 5).joinpath("summary.json").write_text(
        "[1, 2]"
    )
    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--json")
    assert table.returncode == 0, table.stderr
    states = {run["experiment_id"]: run["state"] for run in json.loads(table.stdout)}
    assert states == {
        "arrayed": "unreadable", "cut": "unreadable", "edited": "unreadable", "good": "done",
        "listed": "unreadable", "summed": "unreadable", "typed": "unreadable",
        "worded": "unreadable",
    }  # fmt: skip
    # The table, and a batch script's last line, as well.
    text = run_module("tfconfig_slurm.commands", "runs", str(tmp_path))
    assert text.returncode == 0 and text.stdout.count(" unreadable ") == 7, text.stderr
    typed = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path / 'typed'}")
    assert typed.returncode == 0, typed.stderr
    assert typed.stdout == (
        f"{tmp_path / 'typed'}: unreadable: its state.json or summary.json is not what the "
        "runtime writes\n"
    ), typed.stdout
    a_file = run_module("tfconfig_slurm.commands", "runs", str(tmp_path / "cut" / "state.json"))
    assert (a_file.returncode, a_file.stderr.count("\n")) == (2, 1), a_file.stderr
    assert "OUTPUT_ROOT: " in a_file.stderr and "is not a directory" in a_file.stderr
    # Chosen by the variable, the root is named by it.
    unset = run_module(
        "tfconfig_slurm.commands", "runs", environ={"TFCONFIG_SLURM_OUTPUT": str(tmp_path / "no")}
    )
    assert unset.returncode == 2, unset.stderr
    assert unset.stderr.startswith(
        f"tfconfig-slurm runs: TFCONFIG_SLURM_OUTPUT: '{tmp_path / 'no'}' does not exist. HINT: "
    ), unset.stderr


def test_the_runs_table_of_no_runs_says_so_and_points_a_run_s_directory_to_its_root(
    tmp_path: Path,
) -> None:
    run = run_dir(tmp_path, "a", {"state": "done"}, {"eval": {"accuracy": 0.9}}, 5)
    (tmp_path / "empty").mkdir()
    empty = run_module("tfconfig_slurm.commands", "runs", str(tmp_path / "empty"))
    assert empty.returncode == 0 and empty.stdout.startswith("EXPERIMENT_ID")
    assert empty.stderr == f"tfconfig-slurm runs: no runs in {tmp_path / 'empty'}.\n"
    given_a_run = run_module("tfconfig_slurm.commands", "runs", str(run))
    assert given_a_run.returncode == 0
    assert f"HINT: {run} is a run; its output root lists it: tfconfig-slurm runs {tmp_path}\n" in (
        given_a_run.stderr
    )


def test_the_runs_table_says_how_slurm_ended_a_job_the_run_could_not_say(tmp_path: Path) -> None:
    """squeue lists ended jobs for a while (MinJobAge): a squeue that says so, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(
        "#!/bin/sh\nprintf '41 NODE_FAIL\\n42 OUT_OF_MEMORY\\n43 CANCELLED\\n44 FAILED\\n'\n"
    )
    squeue.chmod(0o755)
    root = tmp_path / "runs"
    for name, job, said in (("a", 41, "running"), ("b", 42, "running"),
                            ("c", 43, "stopped"), ("d", 44, "running")):  # fmt: skip
        run_dir(root, name, {"state": said, "job_id": str(job), "signal": "SIGTERM"}, None, 5)
    table = run_module(
        "tfconfig_slurm.commands",
        "runs",
        str(root),
        "--json",
        environ={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert table.returncode == 0, table.stderr
    assert [(run["state"], run["ended_by"]) for run in json.loads(table.stdout)] == [
        ("failed", "node failure"),
        ("failed", "out of memory"),
        ("stopped", "cancelled"),
        ("failed", None),
    ]


def test_a_job_refused_at_its_start_is_in_the_runs_table_with_its_reason(tmp_path: Path) -> None:
    """Task 0 of job 57's step refuses its layout (4 tasks a node, 2 GPUs): where its batch
    script made the run's folder (its logs), the table lists the job as refused and says why,
    and --run, the .out's last line, says it; a refusal where a run is comes under the table,
    until the run's next attempt."""
    root = tmp_path / "out"
    (root / "mnist_deep" / "logs").mkdir(parents=True)
    environ = task_env(["node1", "node2"], [4, 4], 0, gpus="0,1", job_id=57)
    refused = run_module(
        "tfconfig_slurm.run", "--experiment=mnist_deep", f"--output_root={root}", environ=environ
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = refused.stderr.strip().splitlines()
    reason = line.removeprefix("tfconfig-slurm-run: ")
    assert "GPUs" in reason, line
    table = run_module("tfconfig_slurm.commands", "runs", str(root))
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[1].split()[:3] == ["mnist_deep", "refused", "-"] and " 57 " in rows[1], rows
    assert rows[2] == f"mnist_deep: job 57 was refused at its start: {reason}"
    standing = run_module("tfconfig_slurm.commands", "runs", f"--run={root / 'mnist_deep'}")
    assert standing.stdout.strip() == (
        f"{root / 'mnist_deep'}: job 57 was refused at its start, nothing was trained: "
        f"{reason}; task logs in {root / 'mnist_deep' / 'logs'}"
    )

    # A run whose attempt began before the refusal keeps its line, the refusal under it.
    earlier = {"state": "done", "job_id": "56", "attempts": [{"started": time.time() - 60}]}
    (root / "mnist_deep" / "state.json").write_text(json.dumps(earlier))
    rows = run_module("tfconfig_slurm.commands", "runs", str(root)).stdout.splitlines()
    assert rows[1].split()[:2] == ["mnist_deep", "done"], rows
    assert rows[2] == f"mnist_deep: job 57 was refused at its start: {reason}"
    # Job 57's own .out ends with its refusal, not with the other job's run.
    own = run_module(
        "tfconfig_slurm.commands", "runs", f"--run={root / 'mnist_deep'}",
        environ={"SLURM_JOB_ID": "57"},
    )  # fmt: skip
    assert f"job 57 was refused at its start, nothing was trained: {reason}" in own.stdout
    # A requeued job keeps its id: its new attempt's refusal is one, where the same attempt
    # that ran the run would have failed, not been refused.
    refusal = root / "mnist_deep" / "refused.json"
    for restart, recorded in (("0", False), ("1", True)):
        refusal.unlink(missing_ok=True)
        attempt = {"job_id": "57", "restart": 0, "started": time.time() - 30}
        (root / "mnist_deep" / "state.json").write_text(
            json.dumps({"state": "stopped", "job_id": "57", "attempts": [attempt]})
        )
        again = run_module(
            "tfconfig_slurm.run", "--experiment=mnist_deep", f"--output_root={root}",
            environ=environ | {"SLURM_RESTART_COUNT": restart},
        )  # fmt: skip
        assert again.returncode == 2 and refusal.exists() == recorded, restart
    (root / "mnist_deep" / "state.json").write_text(json.dumps(earlier))
    later = earlier | {"attempts": [{"started": time.time() + 1}]}
    (root / "mnist_deep" / "state.json").write_text(json.dumps(later))
    rows = run_module("tfconfig_slurm.commands", "runs", str(root)).stdout.splitlines()
    assert len(rows) == 2, rows

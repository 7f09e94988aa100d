"""`tfconfig_slurm.train_and_evaluate` in a user's own script (tests/fixtures/
one_import_estimator.py, a premade DNNClassifier): one process, resumed, a local cluster, a
stop on SIGUSR1, and bad settings. On the SLURM cluster: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import REPOSITORY, checkpoint_step
from tests.slurm_envs import task_env

pytestmark = pytest.mark.tensorflow

SCRIPT = REPOSITORY / "tests" / "fixtures" / "one_import_estimator.py"


def script(model_dir: Path, steps: int, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir), str(steps)],
        env={"PATH": os.environ["PATH"], **environ},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def returned(stdout: str) -> list[dict[str, float]]:
    """What each call of the script returned, as it printed it."""
    return [json.loads(line) for line in re.findall(r"returned (\{.*\})", stdout)]


def test_one_process_trains_reports_keeps_run_config_and_resumes(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    first = script(model_dir, 100)
    assert first.returncode == 0, first.stderr[-3000:]
    [metrics] = returned(first.stdout)
    assert metrics["global_step"] == 100
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["experiment"] == "one_import_estimator"
    assert summary["eval"]["accuracy"] == pytest.approx(metrics["accuracy"])
    # Counted from the input's batches: the script never says its batch size.
    assert summary["trainers"][0]["examples_per_sec"] > 0
    assert re.search(r"step \d+: loss [\d.]+, [\d.]+ examples/s", first.stderr)
    # The script's RunConfig: a checkpoint every 50 steps, 2 kept.
    assert sorted(path.name for path in model_dir.glob("*.index")) == [
        "model.ckpt-100.index",
        "model.ckpt-50.index",
    ]
    again = script(model_dir, 150)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 100" in again.stderr
    assert returned(again.stdout)[0]["global_step"] == 150
    assert checkpoint_step(model_dir) == 150


def test_a_local_cluster_of_the_script_returns_on_the_chief_only(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    result = script(model_dir, 100, TFCONFIG_SLURM_LOCAL_CLUSTER="ps=1,workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    # The tasks' output reaches the launcher's stderr, prefixed.
    assert len(re.findall(r"\[chief 0\] returned \{", result.stderr)) == 1
    assert "returned" not in result.stderr.replace("[chief 0] returned", "")
    assert "ps 0: 2 of 2 trainers finished" in result.stderr
    summary = json.loads((model_dir / "summary.json").read_text())
    assert {trainer["role"] for trainer in summary["trainers"]} == {"chief", "worker"}
    assert summary["global_step"] >= 100
    assert sorted(path.name for path in (model_dir / "logs").iterdir()) == [
        "chief-0.log",
        "ps-0.log",
        "worker-0.log",
    ]


def test_usr1_stops_at_a_step_with_its_checkpoint_and_ends_the_process(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(model_dir), "100000"],
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    # Signalled once it has logged a step past its first, training on.
    training = False
    for line in process.stderr:
        training = training or "first step done" in line
        if training and re.search(r"step [1-9]\d*: loss", line):
            break
    process.send_signal(signal.SIGUSR1)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr[-3000:]
    stopped = re.search(r"stopping on SIGUSR1 at global step (\d+)", stderr)
    assert stopped, stderr[-3000:]
    assert checkpoint_step(model_dir) == int(stopped.group(1))
    # Stopped, the script does not go on as if training had ended.
    assert returned(stdout) == []
    assert not (model_dir / "summary.json").exists()


# Bad settings, each with the start of the one line it ends the script with, exit 2.
BAD_SETTINGS = [
    ({"TFCONFIG_SLURM_LOCAL_CLUSTER": "ps=0,workers=1"}, "TFCONFIG_SLURM_LOCAL_CLUSTER: "),
    ({"TFCONFIG_SLURM_PS_PER_NODE": "two"}, "TFCONFIG_SLURM_PS_PER_NODE: "),
    (
        {"SWAPPED": "1"},
        "train_spec: is an EvalSpec, not a tf.estimator.TrainSpec. HINT: ",
    ),
    (
        {"BAD_LAYOUT": "ps_per_node=2"},
        "layout: is a str, not a tfconfig_slurm.LayoutPolicy. HINT: e.g. "
        "layout=tfconfig_slurm.LayoutPolicy(ps_per_node=2), or leave it out",
    ),
    # In a step of 2 tasks, TFCONFIG_SLURM_ROLES lists 3: the script was given no flag.
    (
        {**task_env(["node1"], [2], 0), "TFCONFIG_SLURM_ROLES": "ps,chief,worker"},
        "TFCONFIG_SLURM_ROLES: lists 3 roles for a step of 2 tasks",
    ),
]


def test_each_bad_setting_is_one_line_naming_it_and_nothing_is_made(tmp_path: Path) -> None:
    """Each a call of the script in one process (the fixture's BAD_CASES), which starts
    TensorFlow once for all: each call ends as its own process would, in one line naming the
    setting and SystemExit(2)."""
    cases = [variables for variables, _ in BAD_SETTINGS]
    result = script(tmp_path / "model", 100, BAD_CASES=json.dumps(cases))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [f"case {n}: exit 2" for n in range(len(cases))]
    # What each call wrote, after what TensorFlow says as it is imported.
    written = re.split(r"^case \d+:\n", result.stderr, flags=re.M)[1:]
    for (_, said), lines in zip(BAD_SETTINGS, written, strict=True):
        last = lines.strip().splitlines()[-1]
        assert last.startswith(f"one_import_estimator.py: {said}"), lines
        assert "HINT: " in last
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "model").exists()

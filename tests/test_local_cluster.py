"""--local_cluster: chief, parameter server and workers as real processes, talking gRPC (on
the fake backend of tests/fake_backend.py, only the watchdog's ports)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fake_backend
from tests.cli import PACED, run_module
from tfconfig_slurm.process.supervision import local_cluster

RUN = "tfconfig_slurm.run"


def run_cluster(root: Path, *flags: str, experiment: str = "mnist_deep"):  # type: ignore[no-untyped-def]
    return run_module(
        RUN,
        f"--experiment={experiment}",
        f"--output_root={root}",
        "--local_cluster=ps=1,workers=1",
        "--log_every_steps=10",
        "--save_checkpoints_steps=20",
        *flags,
    )


def alive(pid: int) -> bool:
    """Whether anything of the process group a task leads still runs, children included."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started_pids(log: str) -> dict[str, int]:
    return {
        f"{role} {index}": int(pid)
        for role, index, pid in re.findall(r"started (\w+) (\d+) at \S+ \(pid (\d+)\)", log)
    }


def leave_stale_reports(model_dir: Path, train_steps: int) -> None:
    """Reports an earlier run with the same steps left, as a requeued job finds them."""
    (model_dir / "trainers").mkdir(parents=True)
    stale = {"role": "worker", "index": 5, "examples_per_sec": 1e9, "train_steps": train_steps}
    (model_dir / "trainers" / "worker-5.json").write_text(json.dumps(stale | {"run": "old"}))
    metrics = {"accuracy": 2.0, "global_step": 10**6}
    earlier = {"run": "old", "train_steps": train_steps, "metrics": metrics}
    (model_dir / "evaluator.json").write_text(json.dumps(earlier))


# The paced experiment (tests/fixtures/paced.py: what is tested here is the cluster around the
# steps), whose input_fn also writes, with --data_dir, the share of the data each trainer was
# given to read, into data_dir/<task>-<mode>.json.
SHARD_PROBE = """
import json, os
from pathlib import Path
from tests.fixtures.paced import HPARAMS, model_fn, input_fn as _input_fn

def input_fn(mode, params):
    if params["data_dir"]:
        task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "single"})
        seen = {"mode": mode, "share": [params["num_trainers"], params["trainer_index"]]}
        name = f"{task['type']}{task.get('index', '')}-{mode}.json"
        Path(params["data_dir"], name).write_text(json.dumps(seen))
    return _input_fn(mode, params)
"""


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Trained to step 40 by a chief, a worker and a ps (SHARD_PROBE): the
    model directory, the launcher's log, and the folder of the shares the trainers read."""
    root = tmp_path_factory.mktemp("cluster")
    (root / "probe.py").write_text(SHARD_PROBE)
    (root / "seen").mkdir()
    leave_stale_reports(root / "probe", 40)
    result = run_cluster(
        root, "--train_steps=40", f"--data_dir={root / 'seen'}", experiment=str(root / "probe.py")
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return root / "probe", result.stderr, root / "seen"


def copy_of(cluster_run, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The module's run copied, for a test that trains it further: the others read it as
    it was, whatever the order."""
    model_dir: Path = cluster_run[0]
    shutil.copytree(model_dir, tmp_path / model_dir.name)
    shutil.copy(model_dir.parent / "probe.py", tmp_path)
    return tmp_path / model_dir.name


def again(model_dir: Path, *flags: str):  # type: ignore[no-untyped-def]
    """The module's experiment run again in a copy of its model directory."""
    return run_cluster(model_dir.parent, *flags, experiment=str(model_dir.parent / "probe.py"))


@pytest.mark.tensorflow
def test_params_tell_each_trainer_its_share_of_the_data(cluster_run) -> None:  # type: ignore[no-untyped-def]
    shares = {path.stem: json.loads(path.read_text())["share"] for path in cluster_run[2].iterdir()}
    # Two trainers (chief, worker 0) read shards 0 and 1 of two.
    trained = {name: share for name, share in shares.items() if name.endswith("-train")}
    assert trained == {"chief0-train": [2, 0], "worker0-train": [2, 1]}


@pytest.mark.tensorflow
def test_every_task_exits_0_and_none_is_left_behind(cluster_run) -> None:  # type: ignore[no-untyped-def]
    model_dir, log, _ = cluster_run
    pids = started_pids(log)
    assert sorted(pids) == ["chief 0", "ps 0", "worker 0"]
    assert all(f"{task} finished" in log for task in pids)
    assert not [pid for pid in pids.values() if alive(pid)]
    assert "ps 0: 2 of 2 trainers finished" in (model_dir / "logs" / "ps-0.log").read_text()


@pytest.mark.tensorflow
def test_no_trainer_warns_of_a_global_step_it_saw_twice(cluster_run) -> None:  # type: ignore[no-untyped-def]
    """Two trainers share the steps: each may read one global step twice, which Estimator's
    step counter takes for an optimizer that counts none, and says so in every task log."""
    logs = "".join(path.read_text() for path in (cluster_run[0] / "logs").iterdir())
    assert "step 40" in logs or "last step done" in logs, logs[-2000:]
    assert "It seems that global step" not in logs


@pytest.mark.tensorflow
def test_every_event_file_reads_back_whole(cluster_run) -> None:  # type: ignore[no-untyped-def]
    """Trainers sharing a host must not share an event file (v1 names carry no pid)."""
    import tensorflow as tf  # noqa: PLC0415

    model_dir, _, _ = cluster_run
    tags: dict[str, set[str]] = {}
    for events in model_dir.rglob("events.out.tfevents.*"):
        folder = str(events.parent.relative_to(model_dir))
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            tags.setdefault(folder, set()).update(value.tag for value in event.summary.value)
    assert {"loss", "examples_per_sec"} <= tags["."]
    assert "examples_per_sec" in tags["worker-0"]


@pytest.mark.tensorflow
def test_the_chief_reports_every_trainer(cluster_run) -> None:  # type: ignore[no-untyped-def]
    model_dir, _, _ = cluster_run
    summary = json.loads((model_dir / "summary.json").read_text())
    # Asynchronous trainers: each stops once it sees step 40, with the step it had in flight
    # and, where it read the step just before another's update, one more (43 seen here).
    assert 40 <= summary["global_step"] <= 40 + 2 * 2
    assert sorted((t["role"], t["index"]) for t in summary["trainers"]) == [
        ("chief", 0),
        ("worker", 0),
    ]
    assert all(t["examples_per_sec"] > 0 for t in summary["trainers"])
    assert summary["layout"]["ps"] and len(summary["layout"]["worker"]) == 1
    # The final checkpoint evaluated: 0.87-0.92 after 40 steps here, chance is 0.5.
    assert summary["eval"]["global_step"] == summary["global_step"]
    assert summary["eval"]["accuracy"] > 0.7
    for task in ("chief-0", "ps-0", "worker-0"):
        assert (model_dir / "logs" / f"{task}.log").stat().st_size > 0


@pytest.mark.tensorflow
def test_a_finished_model_ends_every_task_at_once(cluster_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Nothing left to train: trainers still release the ps, and all exit 0."""
    model_dir = copy_of(cluster_run, tmp_path)
    result = again(model_dir, "--train_steps=40")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ps 0: 2 of 2 trainers finished" in result.stderr


@pytest.mark.tensorflow
def test_resumes_in_a_cluster(cluster_run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model_dir = copy_of(cluster_run, tmp_path)
    first_step = json.loads((model_dir / "summary.json").read_text())["global_step"]
    result = again(model_dir, "--train_steps=80")
    assert result.returncode == 0, result.stderr[-4000:]
    assert re.search(rf"\[chief 0\].*resuming from step {first_step}\b", result.stderr)
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] >= 80
    # The first run's throughput reports are still there; the summary has this run's only.
    assert [trainer["train_steps"] for trainer in summary["trainers"]] == [80, 80]


# Estimator's workers raise in their model_fn: the error comes through its session.
FAILING_WORKER = """
import json, os
from tests.fixtures.paced import HPARAMS, input_fn, model_fn as _model_fn

def model_fn(features, labels, mode, params):
    if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "worker":
        raise RuntimeError("this worker breaks on purpose")
    return _model_fn(features, labels, mode, params)
"""


@pytest.mark.parametrize(
    "backend",
    [pytest.param("estimator", marks=pytest.mark.tensorflow), "fake"],
)
def test_a_failing_task_stops_the_others(tmp_path: Path, backend: str) -> None:
    """Estimator's worker raises in its model_fn; the fake backend's (tests/fake_backend.py)
    at its first step."""
    if backend == "fake":
        experiment, environ = PACED, fake_backend.environ(**{fake_backend.FAIL_AS: "worker 0"})
        failed, error = "worker 0", "RuntimeError: this task breaks on purpose"
    else:
        experiment, environ = tmp_path / "paced.py", {}
        experiment.write_text(FAILING_WORKER)
        failed, error = "worker 0", "RuntimeError: this worker breaks on purpose"
    result = run_module(
        RUN,
        f"--experiment={experiment}",
        f"--output_root={tmp_path}",
        "--local_cluster=ps=1,workers=1",
        "--train_steps=100000",
        environ=environ,
    )
    assert result.returncode == 1
    assert re.search(rf"{failed} \(pid \d+\) failed with exit status 1", result.stderr)
    # The run keeps the first failure: the worker that raised, not a peer that saw it go.
    (record,) = (tmp_path / "paced" / "failures").glob("local-*.json")
    first = json.loads(record.read_text())
    assert re.fullmatch(failed, first["task"]), first
    assert (first["what"], first["exit_status"], first["seen_by"]) == (error, 1, None)
    assert f"first to fail: {first['task']} on {first['node']}: RuntimeError:" in result.stderr
    # Stopped by the launcher, the chief has nothing to save once the run failed: it leaves at
    # once, where it would checkpoint and wait for the workers; told to stop, or finding its
    # ps gone first (the ps may read the record sooner), it names the first failure.
    assert re.search(
        rf"\[chief 0\] .* the run failed \(first to fail: {first['task']} on .*\); ending this "
        r"task \(exit 3\)",
        result.stderr,
    ), result.stderr[-3000:]
    pids = started_pids(result.stderr)
    assert len(pids) == 3
    assert not [pid for pid in pids.values() if alive(pid)]


@pytest.mark.tensorflow
def test_an_evaluator_evaluates_instead_of_the_chief(tmp_path: Path) -> None:
    leave_stale_reports(tmp_path / "paced", 40)
    result = run_module(
        RUN,
        f"--experiment={PACED}",
        f"--output_root={tmp_path}",
        "--local_cluster=ps=1,workers=0,evaluator=1",
        "--save_checkpoints_steps=20",
        "--train_steps=40",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    model_dir = tmp_path / "paced"
    evaluated = [int(step) for step in re.findall(r"evaluator 0: step (\d+):", result.stderr)]
    assert evaluated and evaluated == sorted(evaluated) and evaluated[-1] >= 40
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["eval"] == json.loads((model_dir / "evaluator.json").read_text())["metrics"]
    assert summary["eval"]["global_step"] == evaluated[-1]
    assert len(summary["trainers"]) == 1
    assert all(f"{task} finished" in result.stderr for task in ("evaluator 0", "ps 0"))


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("ps=0,workers=2", "is 'ps=0,workers=2': Estimator training in a cluster needs"),
        ("workers=2", "is 'workers=2'"),
        ("ps=1,workers=x", "has 'workers=x'"),
        ("ps=1,workers=1000", "has 'workers=1000', expected ps=N, workers=N (N up to 999)"),
        ("ps=1,gpus=2", "has 'gpus=2'"),
        ("ps=1,evaluator=2", "asks for more than one evaluator"),
        ("ps=1,workers=1,ps=2", "gives ps twice"),
    ],
)
def test_bad_local_cluster_is_one_line(tmp_path: Path, spec: str, said: str) -> None:
    result = run_module(
        RUN, "--experiment=mnist_deep", f"--output_root={tmp_path}", f"--local_cluster={spec}"
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"tfconfig-slurm-run: --local_cluster: {said}"), result.stderr
    assert not (tmp_path / "mnist_deep").exists()


def test_hparams_the_experiment_s_source_refuses_stop_the_launcher_before_any_task(
    tmp_path: Path,
) -> None:
    """mnist_deep's HPARAMS are a literal dict: read without importing it."""
    result = run_cluster(
        tmp_path,
        "--local_cluster=ps=1,workers=1",
        "--hparams=learning_rat=3",
        experiment="mnist_deep",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("tfconfig-slurm-run: --hparams: sets 'learning_rat'")
    assert result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert not (tmp_path / "mnist_deep").exists()


def test_a_directory_of_another_experiment_s_run_stops_the_launcher_before_any_task(
    tmp_path: Path,
) -> None:
    (tmp_path / "mnist_deep").mkdir()
    record = '{"experiment": "tiny", "state": "done"}'
    (tmp_path / "mnist_deep" / "state.json").write_text(record)
    result = run_cluster(tmp_path, "--local_cluster=ps=1,workers=1", experiment="mnist_deep")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"tfconfig-slurm-run: --experiment_id: names {tmp_path / 'mnist_deep'}, a run of 'tiny'"
    )
    assert result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert (tmp_path / "mnist_deep" / "state.json").read_text() == record


# A model module whose HPARAMS only an import can tell.
_BUILT_HPARAMS = (
    "HPARAMS = dict(learning_rate=0.1)\n"
    "def model_fn(features, labels, mode, params): pass\n"
    "def input_fn(mode, params): pass\n"
)


@pytest.mark.parametrize(
    ("flags", "module", "culprit"),
    [
        (("--hparams=learning_rat=3",), _BUILT_HPARAMS, "--hparams: sets 'learning_rat'"),
        ((), "HPARAMS = {}\ndef input_fn(mode, params): pass\n", "defines no model_fn"),
    ],
)
def test_bad_input_found_in_the_tasks_is_one_line_and_exit_2(
    tmp_path: Path, flags: tuple[str, ...], module: str, culprit: str
) -> None:
    """Every task refuses the same flags; the user reads the refusal once, as from one process."""
    (tmp_path / "no_model.py").write_text(module)
    experiment = str(tmp_path / "no_model.py")
    # The chief and a ps: the one line is the same for any number of tasks.
    result = run_cluster(
        tmp_path,
        "--train_steps=10",
        "--local_cluster=ps=1,workers=0",
        *flags,
        experiment=experiment,
    )
    assert result.returncode == 2
    assert sorted(started_pids(result.stderr)) == ["chief 0", "ps 0"]
    lines = [line for line in result.stderr.splitlines() if "] started " not in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("tfconfig-slurm-run: ") and culprit in lines[0]
    assert "HINT: " in lines[0]
    assert not [pid for pid in started_pids(result.stderr).values() if alive(pid)]


@pytest.mark.tensorflow
def test_sync_replicas_take_one_gradient_from_every_trainer_each_step(tmp_path: Path) -> None:
    """Asynchronous trainers would each make about half the global steps; synchronous ones
    make every step together, from the first, and the chief's session closes without the
    queue runner's 120 s wait."""
    result = run_module(
        RUN,
        f"--experiment={PACED}",
        f"--output_root={tmp_path}",
        "--local_cluster=ps=1,workers=1",
        "--sync_replicas",
        "--train_steps=30",
        "--log_every_steps=10",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    local_steps = {
        task: int(steps)
        for task, steps in re.findall(
            r"\[(\w+ \d)\] .*last step done after (\d+) steps here", result.stderr
        )
    }
    assert sorted(local_steps) == ["chief 0", "worker 0"]
    assert all(29 <= steps <= 31 for steps in local_steps.values()), local_steps
    firsts = re.findall(r"first step done \(global step (\d+)\)", result.stderr)
    assert firsts == ["0", "0"]
    summary = json.loads((tmp_path / "paced" / "summary.json").read_text())
    assert summary["global_step"] == 30
    # The 120 s wait at the end, were it back, would run past run_module's 120 s timeout.


# Each trainer signals itself as a step of its own begins, the one named first a step before
# the other: that one stops while the other is already inside the next synchronous step.
SIGNALLED_IN_TURN = """
import json, os, signal
import tensorflow as tf
from tests.fixtures.paced import HPARAMS, input_fn, model_fn as _model_fn

SIGNAL_AT = 4 if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "{first}" else 5

def signal_at(step):
    if step == SIGNAL_AT:
        os.kill(os.getpid(), signal.{signal})
    return step

def model_fn(features, labels, mode, params):
    if mode == tf.estimator.ModeKeys.TRAIN:
        begun = tf.py_function(signal_at, [tf.compat.v1.train.get_global_step()], tf.int64)
        with tf.control_dependencies([begun]):
            features = tf.identity(features)
    return _model_fn(features, labels, mode, params)
"""


@pytest.mark.tensorflow
# SIGTERM's stop takes the same path as SIGUSR1's (a StopRequest): each trainer first, once.
@pytest.mark.parametrize(("first", "signal"), [("chief", "SIGUSR1"), ("worker", "SIGTERM")])
def test_sync_replicas_signalled_a_step_apart_stop_together(
    tmp_path: Path, first: str, signal: str
) -> None:
    """SLURM signals every task, not at one instant. Without the stopping trainer's token the
    other waits inside its step forever (and the chief, if it is the one, checkpoints none)."""
    experiment = tmp_path / "signalled.py"
    experiment.write_text(SIGNALLED_IN_TURN.format(first=first, signal=signal))
    result = run_module(
        RUN,
        f"--experiment={experiment}",
        f"--output_root={tmp_path}",
        "--local_cluster=ps=1,workers=1",
        "--sync_replicas",
        "--train_steps=1000",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    stopped = re.findall(rf"\[(\w+) 0\] .*stopping on {signal} at global step (\d+)", result.stderr)
    assert sorted(stopped) == [("chief", "5"), ("worker", "5")]
    assert "workers stopped within" not in result.stderr
    checkpoint = (tmp_path / "signalled" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-5"' in checkpoint


def test_a_cluster_far_larger_than_the_machine_warns() -> None:
    assert local_cluster.crowding({"ps": 1, "worker": 2, "evaluator": 0}, cpus=2) == ""
    warning = local_cluster.crowding({"ps": 1, "worker": 200, "evaluator": 0}, cpus=2)
    assert warning.startswith("the local cluster has 202 tasks for this machine's 2 CPUs")


@pytest.mark.tensorflow
def test_each_task_of_a_local_cluster_takes_the_threads_explain_gives(cluster_run) -> None:  # type: ignore[no-untyped-def]
    """A chief, a worker and a ps on this machine's CPUs, as the table of one node of 3 tasks
    with those CPUs says."""
    cpus = len(os.sched_getaffinity(0))
    taken = dict(
        re.findall(
            r"\[(\w+ \d)\] .*TensorFlow's threads: (\d+ inside an op, \d+ between ops)",
            cluster_run[1],
        )
    )
    planned = subprocess.run(
        [sys.executable, "-m", "tfconfig_slurm.commands", "--explain", "--nodelist=localhost",
         "--ntasks_per_node=3", f"--cpus_per_node={cpus}", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    explained = {
        f"{task['role']} {task['index']}": (
            f"{task['intra_op_threads']} inside an op, {task['inter_op_threads']} between ops"
        )
        for task in json.loads(planned.stdout)
    }
    assert taken == explained, (taken, explained)

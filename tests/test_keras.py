"""`python -m tfconfig_slurm.run --experiment mnist_keras` on TensorFlow 2.16+ with tf-keras
(.venv-tf2): in one process, as two MultiWorkerMirroredStrategy trainers given their
TF_CONFIG, on the local cluster and on the SLURM test cluster; resumed to the step, stopped on
a signal at an agreed step (and requeued by SLURM), a killed trainer named by the others, and
refused in one line where a flag does not apply. The tests of a stop, a requeue or a refusal
train tests/fixtures/paced_keras.py, whose steps cost next to no CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli import (
    PACED_KERAS,
    REPOSITORY,
    checkpoint_step,
    ended_within,
    free_port_block,
    highest_step,
    read_logs,
    run_module,
    wait_for,
    wait_until,
)
from tests.slurm_cluster import (
    TRAINING,
    SlurmCluster,
    completed_in_its_job,
    finish,
    hung_and_restarted,
    said_requeued,
    submit,
    warn_and_requeue,
)
from tests.test_local_cluster import alive, started_pids
from tests.test_signals import ended
from tests.test_signals import start as start_console
from tests.test_signals import wait_for as wait_for_console

# How a watch or a failed collective names a lost peer (watchdog.silence, watchdog.REFUSED).
LOST_PEER = r"(has not answered for \d+ s|refuses connections)"

pytestmark = pytest.mark.tf2

RUN = "tfconfig_slurm.run"
SUMMARY_KEYS = {"experiment", "global_step", "wall_time_s", "trainers", "eval", "layout"}


def train(
    root: Path, *flags: str, experiment: str = "mnist_keras", timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return run_module(
        RUN, f"--experiment={experiment}", f"--output_root={root}", *flags, timeout=timeout
    )


def test_a_coordinator_s_layout_refuses_one_thread_between_ops(tmp_path: Path) -> None:
    """#55: a ParameterServerStrategy worker with 1 thread between ops hung at its 6th step
    on the test cluster, its gRPC handler holding the one thread its step's ops needed. The
    sizing gives workers 2 or more; a flag that asks for 1 is refused before any task starts."""
    result = train(tmp_path, "--coordinator", "--inter_op_threads=1", "--print_model_dir")
    assert result.returncode == 2
    assert result.stderr.startswith(
        "tfconfig-slurm-run: --inter_op_threads: is 1, and a ParameterServerStrategy worker "
        "needs 2 or more"
    ), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_mnist_keras_trains_and_resumes_to_the_step(tmp_path: Path) -> None:
    """40 steps, then the rest resumed: 80 in all. Its accuracy floor, 97% after 300 steps, is
    bench/accuracy.py's."""
    first = train(
        tmp_path, "--train_steps=40", "--save_checkpoints_steps=20", "--log_every_steps=10"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    model_dir = tmp_path / "mnist_keras"
    assert checkpoint_step(model_dir) == 40
    # Each checkpoint timed, for the stop before a time limit (test_time_limit.py).
    written = re.findall(r"checkpoint of step (\d+) written in \d+\.\d\d s", first.stderr)
    assert written == ["20", "40"], first.stderr[-3000:]
    logged = re.search(
        r"step 30: loss (\d[\d.e-]*), [\d.]+ examples/s, [\d.]+ global steps/s", first.stderr
    )
    # Learnt by step 30 (0.36 here): below a guess among 10 classes (ln 10 = 2.3).
    assert logged and 0 < float(logged.group(1)) < 1.0, first.stderr[-3000:]
    # The export said in the runtime's one line, without TensorFlow's own INFO lines, nor
    # its start-up notes (oneDNN, CPU features) or its failed cuInit, where no GPU was asked.
    assert "exported the model to " in first.stderr
    assert "oneDNN custom operations" not in first.stderr
    assert "failed call to cuInit" not in first.stderr
    assert not re.search(r"^I\d+ .* (save|fingerprinting_utils)\.py:", first.stderr, re.M)
    second = train(tmp_path, "--train_steps=80")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from step 40" in second.stderr
    assert "first step done (global step 41)" in second.stderr
    summary = json.loads((model_dir / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert summary["global_step"] == 80 and summary["layout"] == "single process"
    # Evaluated after training: 0.96 after 60 steps here, chance is 0.1.
    assert summary["eval"]["accuracy"] > 0.5, summary
    assert summary["trainers"][0]["examples_per_sec"] > 0
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["global_step"]) == ("done", 80)
    assert state["hparams"] == {"learning_rate": 0.001, "dropout": 0.5, "shuffle_buffer": 10000}
    # TensorBoard's runs: the training scalars, and the final evaluation under eval/.
    assert list((model_dir / "eval").glob("events.out.tfevents.*"))
    # The HParams tab's session, written once, at the run's first start.
    assert hparams_sessions(model_dir) == [
        {"learning_rate": 0.001, "dropout": 0.5, "shuffle_buffer": 10000}
    ]
    # Each run that trained to its end exported the model, as a SavedModel that serves.
    exports = sorted((model_dir / "export" / "mnist_keras").iterdir())
    assert len(exports) == 2
    assert served_classes(exports[-1]) == 10


def served_classes(export: Path) -> int:
    """The number of classes the exported model scores for one image."""
    import numpy as np  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415

    model = tf_keras.models.load_model(str(export))
    scores = model.predict(np.zeros((1, *model.input_shape[1:]), np.float32), verbose=0)
    return int(scores.shape[-1])


def hparams_sessions(model_dir: Path) -> list[dict[str, object]]:
    """The hparams of each HParams session start in the run's event files (numbers only)."""
    import tensorflow as tf  # noqa: PLC0415
    from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: PLC0415

    sessions: list[dict[str, object]] = []
    for events in sorted(model_dir.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = plugin_data_pb2.HParamsPluginData.FromString(
                        value.metadata.plugin_data.content
                    )
                    hparams = data.session_start_info.hparams
                    sessions.append(
                        {
                            name: pytest.approx(hparams[name].number_value)
                            for name in hparams
                            if hparams[name].HasField("number_value")
                        }
                    )
    return sessions


def test_a_keras_experiment_that_raises_leaves_its_run_failed(tmp_path: Path) -> None:
    """An error of the experiment's own passes through, and state.json says the run failed,
    as an Estimator run's does."""
    (tmp_path / "broken.py").write_text(
        "from tfconfig_slurm.experiments.mnist_keras import HPARAMS, build_model\n"
        "def dataset(mode, params):\n"
        "    raise RuntimeError('the data is not there')\n"
    )
    result = run_module(
        RUN, f"--experiment={tmp_path / 'broken.py'}", f"--output_root={tmp_path}",
        "--train_steps=10", timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "RuntimeError: the data is not there" in result.stderr
    state = json.loads((tmp_path / "broken" / "state.json").read_text())
    assert (state["state"], state["global_step"]) == ("failed", 0)


def start(root: Path, tf_config: dict[str, object], *flags: str) -> subprocess.Popen[str]:
    """A paced Keras trainer of the cluster `tf_config` gives."""
    return subprocess.Popen(
        [sys.executable, "-m", RUN, f"--experiment={PACED_KERAS}", f"--output_root={root}",
         "--train_steps=100000", "--log_every_steps=10", *flags],
        env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stopped_together_by_the_worker(
    tmp_path: Path,
    start_task: Callable[[str, dict[str, list[str]]], subprocess.Popen[str]],
    experiment: str,
    after: str,
) -> int:
    """A chief and a worker of `experiment` on loopback, each started by
    `start_task(kind, cluster)`; SIGUSR1 to the worker only once its log says `after` (the
    others' lines, a few a second, wait in their pipe): both stop at one step, exit 0, save
    it, and the chief's state.json says the run stopped there on SIGUSR1. Returns the step."""
    base = free_port_block(2)
    cluster = {"chief": [f"localhost:{base}"], "worker": [f"localhost:{base + 1}"]}
    tasks = [start_task(kind, cluster) for kind in ("chief", "worker")]
    try:
        assert tasks[1].stderr is not None
        early = []
        for line in tasks[1].stderr:
            early.append(line)
            if after in line:
                break
        tasks[1].send_signal(signal.SIGUSR1)
        logs = [task.communicate(timeout=120)[1] for task in tasks]
        logs[1] = "".join(early) + logs[1]
    finally:
        for task in tasks:
            task.kill()
    assert [task.returncode for task in tasks] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    steps = [re.search(r"stopping on (.+?) at global step (\d+)", log) for log in logs]
    assert steps[0] and steps[1], logs
    assert steps[0].group(1) == steps[1].group(1) == "SIGUSR1"
    stopped = int(steps[0].group(2))
    assert int(steps[1].group(2)) == stopped
    model_dir = tmp_path / experiment
    assert checkpoint_step(model_dir) == stopped
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["signal"], state["global_step"]) == (
        "stopped",
        "SIGUSR1",
        stopped,
    )
    return stopped


def test_two_trainers_stop_together_on_one_s_signal_with_the_step_saved(tmp_path: Path) -> None:
    """SIGUSR1 reaches the worker only: the chief learns it at the next agreement, both save
    the same step and exit 0, and the chief says the run stopped on SIGUSR1 (the signal that
    requeues); a run started again resumes from that step."""
    stopped = stopped_together_by_the_worker(
        tmp_path,
        lambda kind, cluster: start(
            tmp_path, {"cluster": cluster, "task": {"type": kind, "index": 0}}
        ),
        "paced_keras",
        after="first step done",
    )
    # The trainers agree every keras_run.STOP_CHECK_STEPS steps.
    assert stopped % 10 == 0
    model_dir = tmp_path / "paced_keras"
    resumed = train(tmp_path, f"--train_steps={stopped + 5}", experiment=str(PACED_KERAS))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step {stopped}" in resumed.stderr
    assert checkpoint_step(model_dir) == stopped + 5


def assert_different_starts_refused(
    tmp_path: Path,
    start_task: Callable[[Path, dict[str, list[str]], str], subprocess.Popen[str]],
    experiment: str,
    who: str,
) -> None:
    """A chief whose --output_root (tmp_path/shared) holds a checkpoint of step 10 of
    `experiment`, and a worker whose (tmp_path/elsewhere) holds none, each started by
    `start_task(root, cluster, kind)`: both refuse in one line, exit 2, naming their own
    directory, and the worker's run does not begin."""
    base = free_port_block(2)
    cluster = {"chief": [f"localhost:{base}"], "worker": [f"localhost:{base + 1}"]}
    tasks = [
        start_task(tmp_path / root, cluster, kind)
        for kind, root in (("chief", "shared"), ("worker", "elsewhere"))
    ]
    try:
        logs = [task.communicate(timeout=120)[1] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
    assert [task.returncode for task in tasks] == [2, 2], logs
    for log, root in zip(logs, ("shared", "elsewhere")):
        assert log.splitlines()[-1] == (
            f"tfconfig-slurm-run: --output_root: the {who} restored different checkpoints "
            f"of {tmp_path / root / experiment} (global steps 0 to 10): it is not the same "
            "directory on every node. HINT: put --output_root on a file system every node of "
            "the job mounts"
        )
    assert not (tmp_path / "elsewhere" / experiment / "state.json").exists()


def test_trainers_that_restore_different_steps_refuse_in_one_line(tmp_path: Path) -> None:
    """As where the nodes do not share --output_root: the chief finds a checkpoint, the worker
    none. Trained on, their replicas would differ and the worker's last steps would hang."""
    first = train(tmp_path / "shared", "--train_steps=10", experiment=str(PACED_KERAS))
    assert first.returncode == 0, first.stderr[-3000:]
    assert_different_starts_refused(
        tmp_path,
        lambda root, cluster, kind: start(
            root, {"cluster": cluster, "task": {"type": kind, "index": 0}}
        ),
        "paced_keras",
        "trainers",
    )


def test_a_local_cluster_trains_all_reduce_stops_on_sigterm_and_resumes(tmp_path: Path) -> None:
    """--local_cluster=workers=1: a chief and a worker on loopback, 2 replicas. SIGTERM to the
    launcher (a shell's kill) stops both trainers at one step with its checkpoint and leaves
    no task behind; a new local cluster resumes there, and both trainers report."""
    process, console = start_console(
        tmp_path, f"--experiment={PACED_KERAS}", "--train_steps=1000000", "--log_every_steps=1",
        "--local_cluster=workers=1",
    )  # fmt: skip
    wait_for_console(console, r"(?s)first step done.*first step done", process)
    process.send_signal(signal.SIGTERM)
    assert ended(process) == 128 + signal.SIGTERM
    log = console.read_text()
    pids = started_pids(log)
    assert sorted(pids) == ["chief 0", "worker 0"]
    assert wait_until(lambda: not [pid for pid in pids.values() if alive(pid)], 5.0)
    assert re.search(r"\[chief 0\] .*chief 0 on .* starting at step 0; 2 replicas", log)
    # The SIGTERM reaches the two in either order: one may stop on the other's, first.
    stops = re.findall(
        r"\[(chief|worker) 0\] .*stopping on (?:SIGTERM|a peer's signal) at global step (\d+)", log
    )
    assert sorted(role for role, _ in stops) == ["chief", "worker"], log[-3000:]
    assert stops[0][1] == stops[1][1]
    stopped = int(stops[0][1])
    model_dir = tmp_path / "paced_keras"
    assert checkpoint_step(model_dir) == stopped
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["signal"]) == ("stopped", "SIGTERM")

    # Resumed with a checkpoint due every second: the trainers agree on it at their stop
    # checks (a save is a collective), so each is at a multiple of 10 steps.
    resumed = train(
        tmp_path, "--local_cluster=workers=1", f"--train_steps={stopped + 60}",
        "--save_checkpoints_secs=1", experiment=str(PACED_KERAS), timeout=240,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for role in ("chief", "worker"):
        assert re.search(
            rf"\[{role} 0\] .* resuming from step {stopped}; 2 replicas", resumed.stderr
        )
        assert f"{role} 0 finished" in resumed.stderr
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == stopped + 60
    timed = [
        int(step)
        for step in re.findall(r"\[chief 0\] .*checkpoint of step (\d+) written", resumed.stderr)
        if int(step) < stopped + 60
    ]
    assert len(timed) >= 2 and all(step % 10 == 0 for step in timed), resumed.stderr[-3000:]
    assert sorted(summary["layout"]) == ["chief", "worker"]
    assert [trainer["role"] for trainer in summary["trainers"]] == ["chief", "worker"]
    assert checkpoint_step(model_dir) == stopped + 60
    assert {log.name for log in (model_dir / "logs").iterdir()} == {"chief-0.log", "worker-0.log"}
    # The chief's export only: the worker's, made for the collectives, is deleted.
    (export,) = (model_dir / "export" / "paced_keras").iterdir()
    assert served_classes(export) == 2


def test_a_local_coordinator_cluster_trains_evaluates_and_every_task_exits_0(
    tmp_path: Path,
) -> None:
    """--coordinator --local_cluster: ParameterServerStrategy on this machine, a coordinator,
    a ps and a worker, each task supervising its child as in a SLURM step; without an
    evaluator the coordinator evaluates in a process of its own. mnist_keras trains with its
    data in the dataset's graph (a worker builds it). (The sidecar evaluator: the SLURM test
    below.)"""
    # A checkpoint due every second: the coordinator reads its clock at each epoch's end.
    # Epochs of 15 steps, half the run, as --log_every_steps is longer than the run.
    result = train(
        tmp_path, "--coordinator", "--local_cluster=ps=1,workers=1",
        "--train_steps=30", "--log_every_steps=40", "--save_checkpoints_secs=1",
        experiment="mnist_keras", timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    # The first epoch, start-up in it, takes more than a second: a checkpoint is due at its
    # end, and only at an epoch's end.
    timed = set(re.findall(r"\[chief 0\] .*checkpoint of step (\d+) written", log))
    assert "15" in timed and timed <= {"15", "30"}, log[-3000:]
    assert "[chief 0] " in log and "coordinating 1 worker(s) and 1 parameter server(s)" in log
    first = r"\[chief 0\] .*first step done \(global step 15\): loss [\d.]+ over its 15 steps"
    assert re.search(first, log), log[-3000:]
    assert re.search(r"\[chief 0\] .*step 30: loss [\d.]+, [\d.]+ examples/s", log), log[-3000:]
    for task in ("chief 0", "ps 0", "worker 0"):
        assert f"{task} finished" in log, log[-3000:]
    # The servers' threads sized as every task's are (cluster/role.py): on this machine's
    # CPUs, one worker a node keeps them all, as the ps does.
    cpus = len(os.sched_getaffinity(0))
    for task in ("ps 0", "worker 0"):
        assert re.search(
            rf"\[{task}\] .*TensorFlow's threads: {cpus} inside an op, {cpus} between ops", log
        ), log[-3000:]
    # The servers' TensorFlow start-up notes held back too, as every other task's are.
    assert not re.search(r"\[(ps|worker) 0\] .*(oneDNN custom operations|cuInit)", log), log
    model_dir = tmp_path / "mnist_keras"
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == summary["eval"]["global_step"] == 30
    assert summary["trainers"][0]["examples_per_sec"] > 0, summary
    assert summary["eval"]["accuracy"] > 0.5
    assert checkpoint_step(model_dir) == 30
    # What the other backends write too: the run's state, and its HParams session.
    assert json.loads((model_dir / "state.json").read_text())["state"] == "done"
    assert hparams_sessions(model_dir) == [
        {"learning_rate": 0.001, "dropout": 0.5, "shuffle_buffer": 10000}
    ]


def test_a_coordinator_stops_within_its_workers_scheduled_steps_not_at_its_epoch_s_end(
    tmp_path: Path,
) -> None:
    """ParameterServerStrategy's fit runs epochs of --log_every_steps steps (here 200 of
    0.2 s), and the coordinator would schedule an epoch's steps at once: SIGUSR1, sent once
    the worker reads its data, stops the run a few steps in, with a checkpoint of that step,
    not at step 200."""
    record = tmp_path / "examples-read.txt"
    launcher = subprocess.Popen(
        [sys.executable, "-m", RUN, f"--experiment={PACED_KERAS}", f"--output_root={tmp_path}",
         "--coordinator", "--local_cluster=ps=1,workers=1", "--train_steps=1000",
         f"--log_every_steps={EPOCH_STEPS}"],
        env={**os.environ, "PACED_KERAS_RECORD": str(record),
             "PACED_KERAS_PACE_MICROSECONDS": "200000"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: record.exists() and record.stat().st_size > 0, START_SECONDS)
        launcher.send_signal(signal.SIGUSR1)
        _, log = launcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        launcher.kill()
        pytest.fail(f"still running 120 s after SIGUSR1:\n{launcher.communicate()[1][-5000:]}")
    finally:
        launcher.kill()
    assert launcher.returncode == 0, log[-3000:]
    (stopped,) = map(int, re.findall(r"stopping on SIGUSR1 at global step (\d+)", log))
    assert 0 < stopped < EPOCH_STEPS, log[-3000:]
    assert checkpoint_step(tmp_path / "paced_keras") == stopped


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("import sys; sys.exit(3)", "exited 3"),
        ("pass", "printed no metrics as its last line ([])"),
        ("print('a library says hello')", "printed no metrics as its last line (['a library"),
        ("import time; time.sleep(30)", "took more than 1 s"),
    ],
)
def test_a_final_evaluation_that_gives_no_metrics_says_why(script: str, said: str) -> None:
    """The coordinator's evaluation process, which ends a run: a failure, nothing printed
    (an IndexError before), a last line of no JSON, or a hang, each in one error."""
    from tfconfig_slurm.backends.keras.coordinator import (  # noqa: PLC0415
        EvaluationError,
        run_evaluation,
    )

    with pytest.raises(EvaluationError, match=re.escape(f"the final evaluation {said}")):
        run_evaluation([sys.executable, "-c", script], os.environ, seconds=1.0)
    assert run_evaluation(
        [sys.executable, "-c", "print('noise'); print('{\"accuracy\": 0.5}')"], os.environ
    ) == {"accuracy": 0.5}


# The coordinator's epoch in the test above: 40 s of its worker's steps.
EPOCH_STEPS = 200


@pytest.mark.parametrize(
    ("flag", "culprit"),
    [
        ("--ps_per_node=1", "--ps_per_node: asks for parameter servers"),
        ("--roles=ps,chief", "--roles: asks for parameter servers"),
        ("--evaluator", "--evaluator: does not apply to a Keras experiment"),
        ("--local_cluster=ps=1,workers=1", "--local_cluster: is 'ps=1,workers=1': a Keras"),
        ("--local_cluster=workers=1,evaluator=1", "--local_cluster: is 'workers=1,evaluator=1'"),
        ("--roles=chief,worker,evaluator", "--roles: asks for parameter servers or an evaluator"),
        ("--gpu_memory_growth", "--gpu_memory_growth: does not apply"),
        ("--sync_replicas", "--sync_replicas: does not apply to a Keras experiment: all-reduce"),
        (
            "--coordinator --sync_replicas",
            "--sync_replicas: does not apply to a Keras experiment: ParameterServerStrategy's",
        ),
        ("--coordinator", "--coordinator: lays out a step of several tasks"),
        (
            "--coordinator --local_cluster=workers=1",
            "--local_cluster: is 'workers=1': ParameterServerStrategy needs at least one ps",
        ),
        (
            "--coordinator --local_cluster=ps=1",
            "--local_cluster: is 'ps=1': the coordinator trains nothing, so it needs at least",
        ),
    ],
)
def test_a_flag_a_keras_experiment_cannot_honour_is_one_line(
    tmp_path: Path, flag: str, culprit: str
) -> None:
    result = train(tmp_path, *flag.split(), timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"tfconfig-slurm-run: {culprit}"), result.stderr
    assert not (tmp_path / "mnist_keras").exists()


def test_a_keras_experiment_whose_functions_take_other_arguments_is_refused_at_load(
    tmp_path: Path,
) -> None:
    experiment = tmp_path / "no_params.py"
    experiment.write_text("def build_model():\n    pass\ndef dataset(mode, params):\n    pass\n")
    result = run_module(RUN, f"--experiment={experiment}", f"--output_root={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "tfconfig-slurm-run: --experiment: no_params.build_model() cannot be called "
        "as build_model(params): too many positional arguments. HINT: define build_model(params)"
    )
    assert not (tmp_path / "no_params").exists()


def test_a_keras_experiment_that_does_not_parse_is_its_syntax_error_not_an_install_hint(
    tmp_path: Path,
) -> None:
    """Its kind cannot be read from source that does not parse: it was taken for an
    Estimator experiment, and the refusal said to install TensorFlow 2.15 (a newcomer's)."""
    experiment = tmp_path / "unclosed.py"
    experiment.write_text("import keras\ndef build_model(params):\n    return keras.Sequential((\n")
    result = run_module(RUN, f"--experiment={experiment}", f"--output_root={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"tfconfig-slurm-run: --experiment: importing {experiment} failed at {experiment}:3: "
        "SyntaxError: '(' was never closed"
    ), line
    assert not (tmp_path / "unclosed").exists()


def test_a_tf_keras_experiment_with_a_layout_map_is_refused_at_load(tmp_path: Path) -> None:
    """A LayoutMap is Keras 3's: a tf-keras run would train data-parallel and not read it."""
    experiment = tmp_path / "tf_keras_layout.py"
    experiment.write_text(
        "import tf_keras\n"
        "from tfconfig_slurm.experiments.mnist_keras import build_model, dataset\n"
        "def layout_map(devices, params):\n    pass\n"
    )
    result = run_module(RUN, f"--experiment={experiment}", f"--output_root={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        "tfconfig-slurm-run: --experiment: tf_keras_layout defines layout_map, which is Keras "
        "3's (ModelParallel on JAX): a tf-keras model trains data-parallel with tf.distribute. "
        "HINT: build the model with import keras and train it in .venv-keras3, or remove "
        "layout_map"
    )
    assert not (tmp_path / "tf_keras_layout").exists()


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        # What a newcomer on TensorFlow 2.16+ writes: it trained a whole run, then failed
        # to export, run after run.
        (
            "keras.Sequential([keras.layers.Dense(10)])",
            "a Keras 3 model (keras.src.models.sequential.Sequential). HINT: build a tf-keras "
            "model: import tf_keras as keras",
        ),
        ("tf_keras.Sequential([tf_keras.layers.Dense(10)])", "a model that is not compiled"),
    ],
)
def test_a_model_the_backend_cannot_train_is_refused_in_one_line(
    tmp_path: Path, model: str, problem: str
) -> None:
    experiment = tmp_path / "odd_model.py"
    experiment.write_text(
        "import keras, tf_keras\n"
        "from tfconfig_slurm.experiments.mnist_keras import dataset\n"
        f"def build_model(params):\n    return {model}\n"
    )
    result = run_module(RUN, f"--experiment={experiment}", f"--output_root={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1].startswith(
        f"tfconfig-slurm-run: --experiment: odd_model's build_model returned {problem}"
    ), result.stderr[-3000:]
    # Nothing is left of the run (a newcomer found an empty model directory).
    assert not (tmp_path / "odd_model").exists()


def test_a_tf_config_with_a_parameter_server_is_one_line(tmp_path: Path) -> None:
    """As with-tfconfig without --all_reduce would make: MultiWorkerMirroredStrategy would fail
    the ps's process with a traceback."""
    base = free_port_block(2)
    cluster = {"chief": [f"localhost:{base}"], "ps": [f"localhost:{base + 1}"]}
    result = run_module(
        RUN, "--experiment=mnist_keras", f"--output_root={tmp_path}",
        environ={"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(
        "tfconfig-slurm-run: TF_CONFIG: makes this task ps 0 of a cluster with 1 parameter servers"
    ), result.stderr
    assert not (tmp_path / "mnist_keras").exists()


def test_a_sweep_of_a_keras_experiment_is_checked_against_its_hparams(tmp_path: Path) -> None:
    (tmp_path / "lr.sweep").write_text("learning_rate=0.002\nlearning_rate=0.004,dropout=0.3\n")
    result = subprocess.run(
        [str(REPOSITORY / "launch" / "sweep"), "--dry_run", "lr.sweep",
         "--experiment=mnist_keras", "--output_root=out"],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("sbatch --parsable --array=0-1 --job-name=lr ")
    # TensorFlow 2.16+'s start-up notes, written as the experiment loads, held back.
    assert result.stderr == "", result.stderr
    (tmp_path / "bad.sweep").write_text("momentum=0.9\n")
    bad = subprocess.run(
        [str(REPOSITORY / "launch" / "sweep"), "--dry_run", "bad.sweep",
         "--experiment=mnist_keras"],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    (line,) = bad.stderr.splitlines()
    assert "'momentum', which the experiment's HPARAMS does not have" in line


@pytest.mark.slurm
def test_two_nodes_train_all_reduce_under_plain_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """One task a node: the chief on the first, worker 0 on the second, no parameter server.
    (A resume on the cluster: the requeue test below; mnist_keras's own training: its own
    test.)"""
    command = [
        "srun", "--nodes=2", "--ntasks-per-node=1", "--label", "python", "-m", RUN,
        f"--experiment={PACED_KERAS}", f"--output_root={tmp_path}", "--log_every_steps=20",
    ]  # fmt: skip
    first = slurm_cluster.run([*command, "--train_steps=40"])
    assert first.returncode == 0, first.stderr[-3000:]
    chief_node, worker_node = slurm_cluster.nodes
    assert "0: " in first.stderr and f"chief 0 on {chief_node}" in first.stderr
    assert f"worker 0 on {worker_node}" in first.stderr and "2 replicas" in first.stderr
    model_dir = tmp_path / "paced_keras"
    summary = json.loads((model_dir / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert sorted(summary["layout"]) == ["chief", "worker"]
    assert [trainer["role"] for trainer in summary["trainers"]] == ["chief", "worker"]
    assert checkpoint_step(model_dir) == 40
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_coordinator_job_with_an_evaluator_stops_on_usr1_requeues_resumes_and_ends(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """--coordinator --evaluator (ParameterServerStrategy) in launch/train.sbatch: the first
    node runs ps 0, the coordinator and worker 0, the second ps 1, worker 1 and the
    evaluator. Each worker reads its own half of the examples (the fixture records which). The
    warning reaches every task; the servers ignore it, the coordinator stops at the next
    epoch's end with a checkpoint and requeues the job, whose second run resumes there and
    trains to the end; the evaluator evaluates the checkpoints, the final one for
    summary.json; the coordinator's end ends the servers."""
    record = tmp_path / "examples-read.txt"
    job = submit(
        slurm_cluster, tmp_path, "coordinated", f"--experiment={PACED_KERAS}", "--coordinator",
        "--evaluator", f"--train_steps={PACED_STEPS}", "--log_every_steps=10",
        sbatch_options=("--ntasks-per-node=3", "--ntasks=6"),
        environ={"PACED_KERAS_RECORD": str(record)},
    )  # fmt: skip
    logs = tmp_path / "coordinated" / "logs"
    job_id, ended = warn_and_requeue(
        slurm_cluster, job, logs, start_seconds=START_SECONDS, end_seconds=END_SECONDS,
        training=r"step \d+: loss",
    )  # fmt: skip
    log = read_logs(logs)
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "1")
    assert "coordinating 2 worker(s) and 2 parameter server(s)" in log
    # Worker k read share k of 2: disjoint, and together every example.
    read: dict[int, set[int]] = {}
    for line in record.read_text().splitlines():
        worker, example = map(int, line.split())
        read.setdefault(worker, set()).add(example)
    assert sorted(read) == [0, 1], sorted(read)
    assert not read[0] & read[1] and read[0] | read[1] == set(range(EXAMPLES)), read
    (stopped_at,) = re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    assert said_requeued(log, job_id), log[-3000:]
    first, second = slurm_cluster.nodes
    resumed = rf"chief 0 on {first} at {first}:\d+ .* resuming from step {stopped_at}\b"
    assert re.search(resumed, log)
    assert re.search(rf"step {PACED_STEPS}: loss [\d.]+, [\d.]+ examples/s", log), log[-3000:]
    assert "ps 1: the coordinator finished; ending its command" in log
    # The evaluator is outside the cluster, on the second node, without a GPU (worker 1 has
    # them).
    assert re.search(rf"evaluator 0 on {second} at - with GPUs \[\],", log), log[-3000:]
    (final,) = re.findall(rf"evaluator 0: step {PACED_STEPS}: accuracy ([\d.]+)", log)
    model_dir = tmp_path / "coordinated"
    assert checkpoint_step(model_dir) == PACED_STEPS
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == summary["eval"]["global_step"] == PACED_STEPS
    # The evaluator's metrics, of the model trained over both runs (chance is 0.5).
    assert f"{summary['eval']['accuracy']:.4g}" == final and summary["eval"]["accuracy"] > 0.9
    assert sorted(summary["layout"]) == ["chief", "ps", "worker"]
    assert json.loads((model_dir / "state.json").read_text())["state"] == "done"
    assert slurm_cluster.left_behind() == {}


# Two TensorFlow processes starting on 2 cores, their strategy meeting, and their first steps.
START_SECONDS = 180.0
# paced_keras.py's EXAMPLES.
EXAMPLES = 256
# A paced Keras job's steps (20 a second at most): time for the warning to reach it while it
# trains, and enough to learn its examples over its two runs.
PACED_STEPS = 200
# A fault must end the step within this; a hang is what the tests exist to catch.
END_SECONDS = 60.0


def srun_keras(cluster: SlurmCluster, root: Path, *flags: str) -> subprocess.Popen[str]:
    """mnist_keras in a plain 2-node step (one trainer a node), one log per task in
    root/logs; without --kill-on-bad-exit SLURM waits for every task, so only the runtime
    can end the survivors of a fault."""
    (root / "logs").mkdir()
    return subprocess.Popen(
        ["srun", "--nodes=2", "--ntasks-per-node=1", f"--output={root}/logs/%t.log",
         sys.executable, "-m", RUN, "--experiment=mnist_keras", f"--output_root={root}", *flags],
        env=cluster.environ(), cwd=REPOSITORY,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slurm
def test_a_killed_keras_trainer_ends_the_step_and_is_named(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    step = srun_keras(slurm_cluster, tmp_path, "--train_steps=1000000", "--log_every_steps=1")
    logs = tmp_path / "logs"
    try:
        wait_for(lambda: read_logs(logs), TRAINING, START_SECONDS)
        # Killed mid-training, a few steps in.
        assert wait_until(lambda: highest_step(read_logs(logs)) >= 3, START_SECONDS)
        os.kill(slurm_cluster.task_pid(1), signal.SIGKILL)
        ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    chief = (logs / "0.log").read_text()
    assert step.returncode != 0
    assert re.search(rf"worker 0 at node\d:\d+ {LOST_PEER}", chief), chief[-3000:]
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_keras_trainer_whose_data_hangs_is_named_and_the_step_restarted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """#55, MultiWorkerMirroredStrategy: the worker's tf.data pipeline blocks for ever before
    its 50th batch, in a Python function on a thread of tf.data's, while the chief waits for
    it in the all-reduce; both are found hung at once. The worker is named as the run's first
    failure, waiting in its own code, each task's log has its threads' stacks, and the step
    starts again from the checkpoint of step 40, where it does not hang, and completes."""
    job = submit(
        slurm_cluster, tmp_path, "hangs", f"--experiment={PACED_KERAS}", "--train_steps=100",
        "--save_checkpoints_steps=20", "--hang_timeout=5",
        sbatch_options=("--ntasks-per-node=1",),
        environ={"PACED_KERAS_HANG_AT": "50", "PACED_KERAS_HANG_ONCE": str(tmp_path / "once")},
    )  # fmt: skip
    ended = finish(slurm_cluster, job)
    output = completed_in_its_job(ended, tmp_path)
    *_, resumed = hung_and_restarted(
        output, ended["JobId"], at=r"4\d|50", silent="[56]",
        waits_in="paced_keras.py:LINE in _hang_at",
    )  # fmt: skip
    assert resumed == 40
    logs = read_logs(tmp_path / "hangs" / "logs")
    assert "chief 0, thread MainThread (most recent call last):" in logs
    assert re.search(r"paced_keras.py\", line \d+, in _hang_at\n +time.sleep\(3600\)", logs)
    assert checkpoint_step(tmp_path / "hangs") == 100


@pytest.mark.slurm
def test_usr1_requeues_a_keras_job_that_resumes_from_the_step_it_stopped_at(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """launch/train.sbatch with --experiment=mnist_keras, one trainer a node, warned as
    `#SBATCH --signal=USR1@90` warns a job before its time limit."""
    job = submit(
        slurm_cluster, tmp_path, "preempted", f"--experiment={PACED_KERAS}",
        f"--train_steps={PACED_STEPS}", sbatch_options=("--ntasks-per-node=1",),
    )  # fmt: skip
    logs = tmp_path / "preempted" / "logs"
    job_id, ended = warn_and_requeue(
        slurm_cluster, job, logs, start_seconds=START_SECONDS, end_seconds=END_SECONDS
    )
    log = read_logs(logs)
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "1")
    stopped_at = re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    assert len(stopped_at) == 2 and len(set(stopped_at)) == 1, log[-3000:]
    assert said_requeued(log, job_id), log[-3000:]
    # Every step taken before the signal is kept: the second run starts where both stopped.
    resumed = re.findall(r"(chief|worker) 0 on node\d .* resuming from step (\d+)", log)
    assert sorted(resumed) == [("chief", stopped_at[0]), ("worker", stopped_at[0])]
    model_dir = tmp_path / "preempted"
    assert checkpoint_step(model_dir) == PACED_STEPS
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == PACED_STEPS and summary["eval"]["accuracy"] > 0.9, summary


def test_a_resume_with_another_learning_rate_trains_with_it(tmp_path: Path) -> None:
    """The checkpoint holds the optimizer's rate too: the resumed run's follows --hparams."""
    assert train(tmp_path, "--train_steps=10", experiment=str(PACED_KERAS)).returncode == 0
    again = train(
        tmp_path, "--train_steps=20", "--hparams=learning_rate=0.1", experiment=str(PACED_KERAS)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    import tensorflow as tf  # noqa: PLC0415

    saved = tf.train.load_checkpoint(str(tmp_path / "paced_keras"))
    assert saved.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 20
    rate = saved.get_tensor("optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE")
    assert rate == pytest.approx(0.1)

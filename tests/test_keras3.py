"""`python -m tfconfig_slurm.run --experiment mnist_keras3`: Keras 3 on JAX (.venv-keras3, no
TensorFlow), in one process and as the processes of a local cluster and of a SLURM step, one
mesh (keras.distribution.DataParallel): resumed to the step, every process ending with the same
weights, stopped at one agreed step on a signal (and requeued by SLURM), a killed process
named. The tests of a stop or a loss train tests/fixtures/paced_keras3.py, whose steps cost next
to no CPU. Run from .venv-tf2's pytest, whose TensorFlow reads the event files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import zipfile
from pathlib import Path

import h5py  # type: ignore[import-untyped]
import pytest

from tests.cli import (
    KERAS3_PYTHON,
    PACED_KERAS3,
    REPOSITORY,
    SHARDED_KERAS3,
    checkpoint_step,
    ended_within,
    free_port_block,
    read_logs,
    run_module,
    wait_until,
)
from tests.slurm_cluster import (
    SlurmCluster,
    completed_in_its_job,
    finish,
    hung_and_restarted,
    said_requeued,
    submit,
    warn_and_requeue,
)
from tests.slurm_envs import task_env
from tests.test_keras import (
    LOST_PEER,
    SUMMARY_KEYS,
    assert_different_starts_refused,
    hparams_sessions,
    stopped_together_by_the_worker,
)
from tests.test_local_cluster import alive, started_pids
from tests.test_signals import ended
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step, render
from tfconfig_slurm.cluster.role import ClusterRole

pytestmark = pytest.mark.keras3

RUN = "tfconfig_slurm.run"
START_SECONDS = 180.0
END_SECONDS = 60.0
_SAME_WEIGHTS = re.compile(r"the (\d+) processes hold the same weights \(checksum ([0-9a-f]{8})\)")


def train(
    root: Path,
    *flags: str,
    experiment: str = "mnist_keras3",
    timeout: float = 300,
    environ: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return run_module(
        RUN,
        f"--experiment={experiment}",
        f"--output_root={root}",
        *flags,
        timeout=timeout,
        python=KERAS3_PYTHON,
        environ=environ,
    )


def start(
    root: Path, *flags: str, environ: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """The runtime on Keras 3 as a user starts it, its console to a file the test reads."""
    console = root / "console.log"
    process = subprocess.Popen(
        [str(KERAS3_PYTHON), "-m", RUN, f"--output_root={root}", *flags],
        env={**os.environ, **(environ or {})},
        stdout=subprocess.DEVNULL,
        stderr=console.open("w"),
        cwd=REPOSITORY,
        text=True,
    )
    return process, console


def trainer(
    root: Path, cluster: dict[str, list[str]], kind: str, *flags: str
) -> subprocess.Popen[str]:
    """A paced Keras 3 process, `kind` 0 of the cluster `cluster`, given its TF_CONFIG."""
    return subprocess.Popen(
        [str(KERAS3_PYTHON), "-m", RUN, f"--experiment={PACED_KERAS3}",
         f"--output_root={root}", *flags],
        env={**os.environ, "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": 0}})},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY,
    )  # fmt: skip


def test_mnist_keras3_trains_in_one_process_and_resumes_to_the_step(tmp_path: Path) -> None:
    first = train(
        tmp_path, "--train_steps=40", "--save_checkpoints_steps=20", "--log_every_steps=10",
        environ={"KERAS_BACKEND": "torch"},
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    # The runtime chooses the backend of its own runs, and says so where another was set.
    assert "KERAS_BACKEND=torch: a Keras 3 experiment trains on JAX here" in first.stderr
    model_dir = tmp_path / "mnist_keras3"
    assert checkpoint_step(model_dir) == 40
    written = re.findall(r"checkpoint of step (\d+) written in \d+\.\d\d s", first.stderr)
    assert written == ["20", "40"], first.stderr[-3000:]
    assert "1 process and 1 device on JAX" in first.stderr
    assert "evaluating the model of step 40 on the whole eval set" in first.stderr
    logged = re.search(r"step 30: loss (\d[\d.e-]*), [\d.]+ examples/s", first.stderr)
    # Learnt by step 30: below a guess among 10 classes (ln 10 = 2.3).
    assert logged and 0 < float(logged.group(1)) < 1.0, first.stderr[-3000:]
    # JAX's own notes of the platforms it lacks, and Keras's warnings of the batches the
    # runtime asks for as meant, are not the user's concern.
    assert "Unable to initialize backend" not in first.stderr
    assert "UserWarning" not in first.stderr

    second = train(tmp_path, "--train_steps=80", "--keep_checkpoint_max=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from step 40" in second.stderr
    assert "first step done (global step 41)" in second.stderr
    summary = json.loads((model_dir / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert summary["global_step"] == 80 and summary["layout"] == "single process"
    # 0.97 after 80 steps here; chance is 0.1.
    assert summary["eval"]["accuracy"] > 0.8, summary
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["global_step"]) == ("done", 80)
    assert state["hparams"] == {"learning_rate": 0.001, "dropout": 0.5}
    # TensorBoard: the scalars, the final evaluation under eval/, the HParams session once.
    assert list((model_dir / "eval").glob("events.out.tfevents.*"))
    assert hparams_sessions(model_dir) == [{"learning_rate": 0.001, "dropout": 0.5}]
    # Checkpoints past --keep_checkpoint_max are forgotten, and the index names the ones
    # kept; none is half-written.
    assert sorted(path.name for path in model_dir.glob("*ckpt-*")) == [
        "ckpt-40.weights.h5",
        "ckpt-80.weights.h5",
    ]
    assert (model_dir / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-80.weights.h5"\n'
        'all_model_checkpoint_paths: "ckpt-40.weights.h5"\n'
        'all_model_checkpoint_paths: "ckpt-80.weights.h5"\n'
    )
    # Each run that trained to its end exported the model as one .keras file; a rerun that
    # trains no step evaluates it again, but does not export it again.
    third = train(tmp_path, "--train_steps=80")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "evaluating the model of step 80 on the whole eval set" in third.stderr
    assert "exported the model" not in third.stderr
    exports = sorted((model_dir / "export" / "mnist_keras3").glob("*/model.keras"))
    assert len(exports) == 2
    with zipfile.ZipFile(exports[-1]) as archive:
        config = json.loads(archive.read("config.json"))
    assert config["class_name"] == "Sequential"


def test_a_local_cluster_trains_one_mesh_stops_on_sigterm_together_and_resumes(
    tmp_path: Path,
) -> None:
    """--local_cluster=workers=1: two JAX processes, one mesh of 2 devices. SIGTERM to the
    launcher stops both at one step with its checkpoint and leaves no process behind; a new
    local cluster resumes there, and both end with the same weights. Each process read its
    own half of the examples."""
    record = tmp_path / "read.txt"
    process, console = start(
        tmp_path, f"--experiment={PACED_KERAS3}", "--train_steps=1000000",
        "--log_every_steps=1", "--local_cluster=workers=1",
        environ={"PACED_KERAS_RECORD": str(record)},
    )  # fmt: skip
    seen = wait_until(
        lambda: len(re.findall(r"step \d+: loss", console.read_text())) >= 4, START_SECONDS
    )
    assert seen, console.read_text()[-3000:]
    # While it trains, the runs table gives the step the chief last logged, not its
    # checkpoint's (none yet).
    listed = json.loads(
        run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--json").stdout
    )
    assert [(run["state"], run["global_step"] >= 3) for run in listed] == [("running", True)]
    process.send_signal(signal.SIGTERM)
    assert ended(process) == 128 + signal.SIGTERM
    log = console.read_text()
    pids = started_pids(log)
    assert sorted(pids) == ["chief 0", "worker 0"]
    assert wait_until(lambda: not [pid for pid in pids.values() if alive(pid)], 5.0)
    assert re.search(r"\[chief 0\] .*starting at step 0; 2 processes and 2 devices on JAX", log)
    # The SIGTERM reaches the two in either order: one may stop on the other's, first.
    stops = re.findall(
        r"\[(chief|worker) 0\] .*stopping on (?:SIGTERM|a peer's signal) at global step (\d+)", log
    )
    assert sorted(role for role, _ in stops) == ["chief", "worker"], log[-3000:]
    assert stops[0][1] == stops[1][1]
    stopped = int(stops[0][1])
    model_dir = tmp_path / "paced_keras3"
    assert checkpoint_step(model_dir) == stopped
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["signal"]) == ("stopped", "SIGTERM")
    read: dict[str, set[int]] = {}
    for line in record.read_text().splitlines():
        index, example = line.split()
        read.setdefault(index, set()).add(int(example))
    # Trainer i of 2 reads examples i, i + 2, ...: two halves, all 256 between them (both
    # read their whole first pass in the steps taken: 2 batches of 64 each).
    assert read["0"] == set(range(0, 256, 2)) and read["1"] == set(range(1, 256, 2)), read

    # Resumed with a checkpoint due every second: the processes agree on it at their stop
    # checks, so each is at a multiple of 10 steps.
    resumed = train(
        tmp_path, "--local_cluster=workers=1", f"--train_steps={stopped + 60}",
        "--save_checkpoints_secs=1", experiment=str(PACED_KERAS3), timeout=240,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for role in ("chief", "worker"):
        assert re.search(
            rf"\[{role} 0\] .* resuming from step {stopped}; 2 processes", resumed.stderr
        )
        assert f"{role} 0 finished" in resumed.stderr
    same = _SAME_WEIGHTS.findall(resumed.stderr)
    assert len(same) == 2 and len(set(same)) == 1 and same[0][0] == "2", resumed.stderr[-3000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == stopped + 60
    assert [trainer["role"] for trainer in summary["trainers"]] == ["chief", "worker"]
    # 0.74-0.86 after 20 steps here, by the run's seed; 40 steps learn the examples; chance is 0.5.
    assert summary["eval"]["accuracy"] > 0.75, summary
    assert checkpoint_step(model_dir) == stopped + 60
    timed = [
        int(step)
        for step in re.findall(r"\[chief 0\] .*checkpoint of step (\d+) written", resumed.stderr)
        if int(step) < stopped + 60
    ]
    assert len(timed) >= 2 and all(step % 10 == 0 for step in timed), resumed.stderr[-3000:]


def test_an_experiment_s_layout_map_trains_model_parallel_and_resumes_on_another_mesh(
    tmp_path: Path,
) -> None:
    """sharded_keras3's layout_map on 4 processes: a mesh of 2 replicas of 2 model shards,
    each process holding half of the hidden layer; the two processes of a replica read the
    same share of the data, the two replicas disjoint halves. The checkpoint holds the layer
    whole, and 2 processes (one replica of 2 shards) resume from it to the step."""
    record = tmp_path / "read.txt"
    first = train(
        tmp_path, "--local_cluster=workers=3", "--train_steps=20", experiment=str(SHARDED_KERAS3),
        environ={"PACED_KERAS_RECORD": str(record)},
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    starts = re.findall(
        r"\[(chief|worker) (\d)\] .*starting at step 0; 4 processes and 4 devices on JAX, "
        r"ModelParallel on a mesh of batch 2 x model 2; data share (\d) of 2",
        first.stderr,
    )
    assert sorted(starts) == [
        ("chief", "0", "1"), ("worker", "0", "1"), ("worker", "1", "2"), ("worker", "2", "2")
    ], first.stderr[-3000:]  # fmt: skip
    lines = record.read_text().splitlines()
    # Each process of a replica read the same examples of its half in its first pass.
    assert sorted(lines) == sorted(
        f"{index} {example}" for index in (0, 1) for example in range(index, 256, 2) for _ in "ab"
    )
    model_dir = tmp_path / "sharded_keras3"
    assert checkpoint_step(model_dir) == 20
    with h5py.File(model_dir / "ckpt-20.weights.h5") as saved:
        kernels = sorted(
            saved[name].shape for name in ("layers/dense/vars/0", "layers/dense_1/vars/0")
        )
    assert kernels == [(8, 16), (16, 2)]

    resumed = train(
        tmp_path, "--local_cluster=workers=1", "--train_steps=30",
        experiment=str(SHARDED_KERAS3),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(re.findall(
        r"resuming from step 20; 2 processes and 2 devices on JAX, ModelParallel on a mesh of "
        r"batch 1 x model 2; data share 1 of 1", resumed.stderr,
    )) == 2, resumed.stderr[-3000:]  # fmt: skip
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == 30
    # 0.99 after 30 steps here; chance is 0.5.
    assert summary["eval"]["accuracy"] > 0.75, summary
    exported = sorted((model_dir / "export" / "sharded_keras3").glob("*/model.keras"))[-1]
    with (
        zipfile.ZipFile(exported) as archive,
        archive.open("model.weights.h5") as weights,
        h5py.File(weights) as saved,
    ):
        assert saved["layers/dense/vars/0"].shape == (8, 16)


def test_a_keras3_experiment_without_jax_or_with_a_tensorflow_flag_is_one_line(
    tmp_path: Path,
) -> None:
    """Where Keras 3 has no JAX (this pytest's own .venv-tf2), and where a flag sizes
    TensorFlow's thread pools: one line each, exit 2, nothing written."""
    no_jax = run_module(
        RUN, "--experiment=mnist_keras3", f"--output_root={tmp_path}", "--train_steps=5"
    )
    assert no_jax.returncode == 2, no_jax.stderr[-3000:]
    (line,) = no_jax.stderr.strip().splitlines()
    assert "--experiment=mnist_keras3 (Keras 3)" in line and "needs JAX beside Keras 3." in line
    assert "make venv-keras3" in line
    threads = train(tmp_path, "--train_steps=5", "--intra_op_threads=2")
    assert threads.returncode == 2, threads.stderr[-3000:]
    (line,) = threads.stderr.strip().splitlines()
    assert "--intra_op_threads" in line and "trains on JAX" in line
    coordinated = train(tmp_path, "--coordinator", "--local_cluster=ps=1,workers=1")
    assert coordinated.returncode == 2, coordinated.stderr[-3000:]
    (line,) = coordinated.stderr.strip().splitlines()
    assert "--coordinator: lays the step out for ParameterServerStrategy" in line
    assert "a Keras 3 experiment trains on JAX" in line
    # All-reduce, chief and workers only: no parameter server, no evaluator.
    for cluster in ("ps=1,workers=1", "workers=1,evaluator=1"):
        refused = train(tmp_path, f"--local_cluster={cluster}")
        assert refused.returncode == 2, refused.stderr[-3000:]
        (line,) = refused.stderr.strip().splitlines()
        assert f"--local_cluster: is '{cluster}': a Keras experiment trains all-reduce" in line
    assert not list(tmp_path.iterdir())


def srun_keras3(cluster: SlurmCluster, root: Path, *flags: str) -> subprocess.Popen[str]:
    """paced_keras3 in a 2-node step of 2 tasks a node, one log per task in root/logs;
    without --kill-on-bad-exit SLURM waits for every task, so only the runtime can end the
    survivors of a fault."""
    (root / "logs").mkdir()
    return subprocess.Popen(
        # Both nodes of the partition, in order, as the tests that kill a process expect.
        ["srun", f"--nodelist={','.join(cluster.nodes)}", "--ntasks-per-node=2",
         f"--output={root}/logs/%t.log",
         str(KERAS3_PYTHON), "-m", RUN, f"--experiment={PACED_KERAS3}", f"--output_root={root}",
         *flags],
        env=cluster.environ(), cwd=REPOSITORY,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slurm
def test_two_nodes_of_two_tasks_train_mnist_keras3_to_the_same_weights(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """4 processes on 2 nodes, one mesh: gloo's collectives cross the nodes on each task's own
    address (the nodes' hostnames resolve to loopback)."""
    command = [
        "srun", "--nodes=2", "--ntasks-per-node=2", "--label", str(KERAS3_PYTHON), "-m", RUN,
        "--experiment=mnist_keras3", f"--output_root={tmp_path}", "--log_every_steps=20",
        "--train_steps=60",
    ]  # fmt: skip
    done = slurm_cluster.run(command, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = slurm_cluster.nodes
    assert f"chief 0 on {first}" in done.stderr and f"worker 2 on {second}" in done.stderr
    assert "4 processes and 4 devices on JAX" in done.stderr
    same = _SAME_WEIGHTS.findall(done.stderr)
    assert len(same) == 4 and len(set(same)) == 1 and same[0][0] == "4", done.stderr[-3000:]
    model_dir = tmp_path / "mnist_keras3"
    summary = json.loads((model_dir / "summary.json").read_text())
    assert sorted(summary["layout"]) == ["chief", "worker"]
    assert len(summary["trainers"]) == 4
    # 60 steps of a global batch of 256: 0.97 here; chance is 0.1.
    assert summary["eval"]["accuracy"] > 0.9, summary
    assert checkpoint_step(model_dir) == 60
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_killed_keras3_process_ends_the_step_and_is_named(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    step = srun_keras3(slurm_cluster, tmp_path, "--train_steps=1000000", "--log_every_steps=1")
    logs = tmp_path / "logs"
    try:
        assert wait_until(
            lambda: len(re.findall(r"step \d+: loss", read_logs(logs))) >= 8, START_SECONDS
        ), read_logs(logs)[-3000:]
        os.kill(slurm_cluster.task_pid(3), signal.SIGKILL)
        ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    assert step.returncode != 0
    # Rank 3's node, as its first line says.
    killed = re.search(r"worker 2 on (node\d)", read_logs(logs))
    assert killed is not None, read_logs(logs)[-3000:]
    named = re.findall(rf"worker 2 at {killed[1]}:\d+ {LOST_PEER}", read_logs(logs))
    assert named, read_logs(logs)[-3000:]
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_usr1_requeues_a_keras3_job_that_resumes_from_the_step_it_stopped_at(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """launch/train.sbatch with TFCONFIG_SLURM_PYTHON set to Keras 3's Python, 2 nodes of one
    task, warned as `#SBATCH --signal=USR1@90` warns a job before its time limit."""
    job = submit(
        slurm_cluster, tmp_path, "preempted", f"--experiment={PACED_KERAS3}",
        "--train_steps=200", sbatch_options=("--ntasks-per-node=1",),
        environ={"TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON)},
    )  # fmt: skip
    logs = tmp_path / "preempted" / "logs"
    job_id, ended_job = warn_and_requeue(
        slurm_cluster, job, logs, start_seconds=START_SECONDS, end_seconds=END_SECONDS,
        training=r"step \d+: loss",
    )  # fmt: skip
    log = read_logs(logs)
    assert (ended_job["JobState"], ended_job["ExitCode"], ended_job["Restarts"]) == (
        "COMPLETED",
        "0:0",
        "1",
    ), log[-3000:]
    stopped_at = re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    assert len(stopped_at) == 2 and len(set(stopped_at)) == 1, log[-3000:]
    assert said_requeued(log, job_id), log[-3000:]
    # #53: the requeue's end, its nodes released one by one, is no node's failure.
    out = (tmp_path / f"train-{job_id}.out").read_text()
    assert not re.search(r"srun: \S+ failed", out), out[-3000:]
    resumed = re.findall(r"(chief|worker) 0 on node\d .* resuming from step (\d+)", log)
    assert sorted(resumed) == [("chief", stopped_at[0]), ("worker", stopped_at[0])]
    model_dir = tmp_path / "preempted"
    assert checkpoint_step(model_dir) == 200
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == 200 and summary["eval"]["accuracy"] > 0.9, summary


@pytest.mark.slurm
def test_a_usr1_a_hung_keras3_step_cannot_take_at_a_step_requeues_it_from_its_checkpoint(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """#55 item 4: the worker's data blocks for ever after step 50 (the hang watch off), and
    the chief waits for it in a collective; USR1 then asks for a stop neither can take at a
    step. Each ends as stopped 20 s later, its stacks logged; the chief requeues the job, which
    resumes from the checkpoint of step 40, where it does not hang, and completes."""
    job = submit(
        slurm_cluster, tmp_path, "stuck", f"--experiment={PACED_KERAS3}", "--train_steps=80",
        "--save_checkpoints_steps=20", "--hang_timeout=0",
        sbatch_options=("--ntasks-per-node=1",),
        environ={"TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON), "PACED_KERAS_HANG_AT": "50",
                 "PACED_KERAS_HANG_ONCE": str(tmp_path / "hung")},
    )  # fmt: skip
    logs = tmp_path / "stuck" / "logs"
    job_id, ended_job = warn_and_requeue(
        slurm_cluster, job, logs, start_seconds=START_SECONDS, end_seconds=END_SECONDS,
        training=r"step 50: loss",
    )  # fmt: skip
    log = read_logs(logs)
    assert (ended_job["JobState"], ended_job["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    # The worker, hung before the signal, and the chief, whose steps ran on a little after it
    # until its collective with the worker waited: only the chief, which requeues, ends.
    not_taken = re.findall(
        r"told to stop on SIGUSR1 (\d+) s ago, and its training has taken no step for (\d+) s: "
        r"it cannot stop at a step with a checkpoint, and (stops now|the task that requeues)",
        log,
    )
    assert sorted(each[2] for each in not_taken) == ["stops now", "the task that requeues"], log
    assert all(20 <= int(each[1]) <= 21 for each in not_taken), not_taken
    assert "worker 0, thread MainThread (most recent call last):" in log
    assert said_requeued(log, job_id), log[-3000:]
    assert re.search(r"(chief|worker) 0 on node\d .* resuming from step 40", log), log[-3000:]
    assert checkpoint_step(tmp_path / "stuck") == 80


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("killed_at", "paced"),
    [
        ("checkpoint of step 40 written", {}),
        # #52: its survivor's collective fails outside fit, in the evaluation (8 s of it).
        ("evaluating the model of step 120", {"PACED_KERAS_EVAL_PACE_MICROSECONDS": "2000000"}),
    ],
    ids=["training", "evaluating"],
)
def test_a_killed_keras3_process_restarts_the_step_in_its_job_from_the_checkpoint(
    slurm_cluster: SlurmCluster, tmp_path: Path, killed_at: str, paced: dict[str, str]
) -> None:
    """launch/train.sbatch's restart for Keras 3, as test_faults holds it for Estimator: the
    process killed, while training or in the final evaluation, is the run's first failure,
    recorded by a process whose collective failed (its port refused: a loss, worth a restart),
    not the survivor's own, and the step starts again in the same job, resumes from the
    checkpoint and finishes."""
    job = submit(
        slurm_cluster, tmp_path, "restarted", f"--experiment={PACED_KERAS3}",
        "--train_steps=120", "--save_checkpoints_steps=20", "--log_every_steps=1",
        sbatch_options=("--ntasks-per-node=1",),
        environ={"TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON), **paced},
    )  # fmt: skip
    logs = tmp_path / "restarted" / "logs"
    try:
        assert wait_until(lambda: killed_at in read_logs(logs), START_SECONDS), read_logs(logs)[
            -3000:
        ]
        os.kill(slurm_cluster.task_pid(1), signal.SIGKILL)
        ended = finish(slurm_cluster, job)
    finally:
        if job.poll() is None:
            job.kill()
    output = completed_in_its_job(ended, tmp_path)
    again = re.search(
        rf"starting the step again in job {ended['JobId']} \(restart 1 of at most 2\), from "
        r"the checkpoint of step (\d+): (worker 0 stopped answering|a task was killed)",
        output,
    )
    assert again is not None, output
    assert int(again[1]) >= 40
    assert re.search(
        rf"(chief|worker) 0 on node\d .* resuming from step {again[1]}", read_logs(logs)
    )
    assert re.search(
        rf"done at step 120: .*; restarted 1x in its job: {again[2]}; task logs", output
    ), output
    assert checkpoint_step(tmp_path / "restarted") == 120


@pytest.mark.slurm
@pytest.mark.parametrize("once", [True, False], ids=["once", "every-time"])
def test_a_keras3_process_whose_data_hangs_is_named_and_the_step_restarted(
    slurm_cluster: SlurmCluster, tmp_path: Path, once: bool
) -> None:
    """#55: the worker's data blocks for ever before global step 50's batch, while the chief
    waits for it in a collective. Within --hang_timeout and the peers' accounts, the worker is
    named as the run's first failure, waiting in its own code, its stack in its log; the step
    starts again from the checkpoint of step 40 and the job completes. Where it hangs there
    every time, the second hang at the same step ends the job, named."""
    hang_once = {"PACED_KERAS_HANG_ONCE": str(tmp_path / "hung")} if once else {}
    job = submit(
        slurm_cluster, tmp_path, "hangs", f"--experiment={PACED_KERAS3}",
        "--train_steps=80", "--save_checkpoints_steps=20", "--hang_timeout=8",
        sbatch_options=("--ntasks-per-node=1",),
        environ={"TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON), "PACED_KERAS_HANG_AT": "50",
                 **hang_once},
    )  # fmt: skip
    ended = finish(slurm_cluster, job)
    output = (tmp_path / f"train-{ended['JobId']}.out").read_text()
    logs = read_logs(tmp_path / "hangs" / "logs")
    _, silent, resumed = hung_and_restarted(
        output, ended["JobId"], at="50", silent=r"\d+", waits_in="paced_keras3.py:LINE in _hang"
    )
    assert 8 <= silent <= 12
    assert resumed == 40
    assert "worker 0, thread MainThread (most recent call last):" in logs
    assert re.search(r"paced_keras3.py\", line \d+, in _hang\n +time.sleep\(3600\)", logs)
    if once:
        completed_in_its_job(ended, tmp_path)
        assert checkpoint_step(tmp_path / "hangs") == 80
    else:
        assert ended["JobState"] == "FAILED", ended
        assert "not starting the step again: worker 0 hung at global step 50 again" in output
    assert slurm_cluster.left_behind() == {}


WITH_TFCONFIG = REPOSITORY / "launch" / "with-tfconfig"
# A user's Keras 3 script, as Keras's distribution guide writes one.
GUIDE = REPOSITORY / "tests" / "fixtures" / "keras3_guide.py"


@pytest.mark.slurm
def test_a_keras3_script_as_the_guide_writes_it_trains_under_with_tfconfig_on_two_nodes(
    slurm_cluster: SlurmCluster,
) -> None:
    """keras.distribution.initialize() with no arguments, on 2 nodes x 2 tasks: one mesh of 4
    devices, gloo across the nodes (whose hostnames resolve to loopback), the same weights in
    every process, exit 0, nothing left behind."""
    done = slurm_cluster.run(
        ["srun", "--nodes=2", "--ntasks-per-node=2", "--label", str(WITH_TFCONFIG), "--keras3",
         str(KERAS3_PYTHON), str(GUIDE)],
        timeout=300, TFCONFIG_SLURM_PYTHON=str(KERAS3_PYTHON),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sums = re.findall(r"process (\d) of 4 devices: weights sum (\S+)", done.stdout)
    assert sorted(process for process, _ in sums) == ["0", "1", "2", "3"], done.stdout[-3000:]
    assert len({total for _, total in sums}) == 1, sums
    assert "chief 0: its command and the 3 trainers below it finished" in done.stderr
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_an_unchanged_keras3_script_on_two_nodes_is_told_its_processes_trained_apart(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """#53: the guide's script without its distribution's lines trains a model of its own in
    each process: each task says so in one line and ends with exit status 1, where the step
    ended 0; with --independent, as meant, 0."""
    plain = tmp_path / "plain.py"
    plain.write_text(
        GUIDE.read_text()
        .replace("keras.distribution.initialize()\n", "")
        .replace("keras.distribution.set_distribution(", "print(")
    )

    def run(*flag: str) -> subprocess.CompletedProcess[str]:
        return slurm_cluster.run(
            ["srun", "--nodes=2", "--ntasks-per-node=1", str(WITH_TFCONFIG), "--keras3",
             *flag, str(KERAS3_PYTHON), str(plain)],
            timeout=300, TFCONFIG_SLURM_PYTHON=str(KERAS3_PYTHON),
        )  # fmt: skip

    apart, independent = run(), run("--independent")
    assert apart.returncode == 1, apart.stderr[-3000:]
    said = re.findall(
        r"(chief|worker) 0: its command used Keras without joining the step's 2 processes, so "
        r"each trained a model of its own \(exit 1\)\. HINT: before building the model, add "
        r"keras\.distribution\.initialize\(\) and keras\.distribution\.set_distribution\("
        r"keras\.distribution\.DataParallel\(auto_shard_dataset=False\)\)",
        apart.stderr,
    )
    assert sorted(said) == ["chief", "worker"], apart.stderr[-3000:]
    assert independent.returncode == 0, independent.stderr[-3000:]
    assert "without joining" not in independent.stderr


@pytest.mark.slurm
def test_a_killed_process_of_a_keras3_script_ends_its_step_named(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The task logs, apart from the run's logs folder, where JAX's ends go.
    logs = tmp_path / "task-logs"
    logs.mkdir()
    step = subprocess.Popen(
        ["srun", "--nodes=2", "--ntasks-per-node=2", f"--output={logs}/%t.log",
         str(WITH_TFCONFIG), "--keras3", "--model_dir", str(tmp_path), str(KERAS3_PYTHON),
         str(GUIDE)],
        env=slurm_cluster.environ(
            TFCONFIG_SLURM_PYTHON=str(KERAS3_PYTHON), PACED_SECONDS="0.05"
        ),
        cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(
            lambda: len(re.findall(r"batch \d+ done", read_logs(logs))) >= 20, START_SECONDS
        ), read_logs(logs)[-3000:]
        os.kill(slurm_cluster.task_pid(3, running=str(GUIDE)), signal.SIGKILL)
        ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    assert step.returncode != 0
    first = json.loads(next((tmp_path / "failures").glob("*.json")).read_text())
    assert first["line"].startswith(f"worker 2 on {slurm_cluster.nodes[1]}"), first
    # The others' tracebacks, where they print one, run through Keras 3: no mistake here.
    assert "build the model with tf-keras" not in read_logs(logs)
    # JAX's abort of a survivor is one line there, its native trace in the run's logs folder.
    assert "Check failure stack trace" not in read_logs(logs)
    for named in re.findall(r"native stack trace: (\S+)\)", read_logs(logs)):
        assert Path(named).parent == tmp_path / "logs"
        assert "Check failure stack trace" in Path(named).read_text()
    assert slurm_cluster.left_behind() == {}


def test_keras_distribution_gives_keras_the_task_s_place_as_with_tfconfig_keras3_does() -> None:
    """tfconfig_slurm.keras_distribution() in rank 3 of a 2 x 2 step: the values
    with-tfconfig --keras3 sets, read from SLURM's variables as every entry point reads them."""
    environ = task_env(["node1", "node2"], [2, 2], 3, gpus="0,1")
    script = (
        "import json, os, tfconfig_slurm; "
        "print(json.dumps([tfconfig_slurm.keras_distribution(), "
        "os.environ['CUDA_VISIBLE_DEVICES'], 'TF_CONFIG' in os.environ, "
        "os.environ['JAX_LOCAL_DEVICE_IDS']]))"
    )
    said = subprocess.run(
        [str(KERAS3_PYTHON), "-c", script], env={"PATH": os.environ["PATH"], **environ},
        capture_output=True, text=True, timeout=60, check=False, cwd=REPOSITORY,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr[-3000:]
    (addresses, processes, process), gpus, tf_config, device_ids = json.loads(said.stdout)
    layout = lay_out_step(read_slurm_step(environ), LayoutPolicy(all_reduce=True))
    role = ClusterRole.from_json(render.task_environment(layout, 3)["TF_CONFIG"])
    assert role.keras_distribution() == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": addresses,
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(processes),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(process),
    }
    assert addresses.split(",")[0].startswith("node1:") and (processes, process) == (4, 3)
    # Its GPU of its node's two, by SLURM's id; no TF_CONFIG left behind for another framework
    # to read.
    assert (gpus, tf_config) == ("1", False)
    # JAX is told to use the one GPU it sees (its 0), not SLURM_LOCALID's 1.
    assert device_ids == "0"
    late = subprocess.run(
        [str(KERAS3_PYTHON), "-c", "import jax; jax.devices(); " + script],
        env={"PATH": os.environ["PATH"], **environ},
        capture_output=True, text=True, timeout=60, check=False, cwd=REPOSITORY,
    )  # fmt: skip
    # One line and exit 2, as every bad use of the call ends.
    assert late.returncode == 2 and late.stderr.count("\n") == 1, late.stderr[-3000:]
    assert (
        late.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "tfconfig_slurm.keras_distribution(): was called after JAX made its backends, so its "
            "CPU collectives can no longer be put on this task's address. HINT: call it first, "
            "before anything uses Keras or JAX"
        )
    ), late.stderr[-3000:]
    one = "import tfconfig_slurm; print(tfconfig_slurm.keras_distribution())"
    alone = subprocess.run(
        [str(KERAS3_PYTHON), "-c", one],
        env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60,
        check=False, cwd=REPOSITORY,
    )  # fmt: skip
    assert re.fullmatch(
        r"KerasDistribution\(job_addresses='localhost:\d+', num_processes=1, process_id=0\)\n",
        alone.stdout,
    ), alone.stderr[-3000:]


SHOW_KERAS = (
    "import json, os; print(json.dumps({name: os.environ.get(name) for name in ("
    "'KERAS_DISTRIBUTION_JOB_ADDRESSES', 'KERAS_DISTRIBUTION_NUM_PROCESSES', "
    "'KERAS_DISTRIBUTION_PROCESS_ID', 'KERAS_BACKEND', 'TFCONFIG_SLURM_GLOO_HOST', "
    "'PYTHONPATH', 'JAX_LOCAL_DEVICE_IDS', 'JAX_ENABLE_PREEMPTION_SERVICE')}))"
)


def with_tfconfig(*arguments: str, rank: int) -> subprocess.CompletedProcess[str]:
    """launch/with-tfconfig in rank `rank` of a one-node step of 4 tasks on loopback, on ports
    free now (another test's task may hold the default ones)."""
    return subprocess.run(
        [str(WITH_TFCONFIG), f"--port_base={free_port_block(4)}", *arguments],
        env={
            "PATH": os.environ["PATH"],
            "TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON),
            "PYTHONPATH": "/my/own",
            **task_env(["localhost"], [4], rank),
        },
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_with_tfconfig_keras3_gives_each_task_keras_distribution_s_variables() -> None:
    """Rank 3, the last worker: its place among 4 processes, the chief's address first, JAX as
    the backend, and the boot folder ahead of the user's own PYTHONPATH."""
    shown = with_tfconfig("--keras3", str(KERAS3_PYTHON), "-c", SHOW_KERAS, rank=3)
    assert shown.returncode == 0, shown.stderr[-3000:]
    environ = json.loads(shown.stdout)
    addresses = environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"].split(",")
    assert len(addresses) == 4 and all(a.startswith("localhost:") for a in addresses)
    assert f"is worker 2 at {addresses[3]}" in shown.stderr
    assert (
        environ["KERAS_DISTRIBUTION_NUM_PROCESSES"],
        environ["KERAS_DISTRIBUTION_PROCESS_ID"],
    ) == ("4", "3")
    assert (environ["KERAS_BACKEND"], environ["TFCONFIG_SLURM_GLOO_HOST"]) == ("jax", "localhost")
    # Not JAX's reading of SLURM_LOCALID (3) as the GPU to use; nor its SIGTERM handler.
    assert (environ["JAX_LOCAL_DEVICE_IDS"], environ["JAX_ENABLE_PREEMPTION_SERVICE"]) == (
        "0",
        "false",
    )
    boot, own = environ["PYTHONPATH"].split(os.pathsep)
    assert (Path(boot) / "sitecustomize.py").is_file() and own == "/my/own"


def test_with_tfconfig_keras3_refuses_tasks_that_are_no_jax_process() -> None:
    refused = with_tfconfig("--keras3", "--ps_per_node=1", "true", rank=0)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("with-tfconfig: --ps_per_node: lays out other tasks than trainers")


def test_processes_that_restore_different_steps_refuse_in_one_line(tmp_path: Path) -> None:
    """As where the nodes do not share --output_root: the chief finds a checkpoint, the worker
    none. Trained on, their weights would differ."""
    first = train(tmp_path / "shared", "--train_steps=10", experiment=str(PACED_KERAS3))
    assert first.returncode == 0, first.stderr[-3000:]
    assert_different_starts_refused(
        tmp_path,
        lambda root, cluster, kind: trainer(root, cluster, kind, "--train_steps=100"),
        "paced_keras3",
        "processes",
    )


def test_a_sweep_of_a_keras3_experiment_is_checked_against_its_hparams(tmp_path: Path) -> None:
    """launch/sweep loads the experiment, on JAX, to check every line before it submits."""
    (tmp_path / "lr.sweep").write_text("learning_rate=0.002\ndropout=0.3\nmomentum=0.9\n")
    bad = subprocess.run(
        [str(REPOSITORY / "launch" / "sweep"), "--dry_run", "lr.sweep",
         "--experiment=mnist_keras3"],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON)},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr[-3000:]
    (line,) = bad.stderr.strip().splitlines()
    assert "run 2 ('momentum=0.9')" in line
    assert "'momentum', which the experiment's HPARAMS does not have" in line


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "def build_model(params):\n"
            "    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])\n"
            "def dataset(mode, params):\n"
            "    return paced_keras3.dataset(mode, params)\n",
            "build_model returned a model that is not compiled. HINT: call model.compile(",
        ),
        (
            "build_model = paced_keras3.build_model\n"
            "def dataset(mode, params):\n"
            "    return np.zeros((64, 8), np.float32), np.zeros(64, np.int32)\n",
            "returned 'tuple', not batches that fit reads one at a time. HINT: return a "
            "generator of (inputs, targets) batches",
        ),
        (
            "build_model = paced_keras3.build_model\n"
            "def dataset(mode, params):\n"
            "    return paced_keras3.dataset('eval', params)\n",
            "mine.dataset('train', params) ran out at global step 4, before --train_steps=5. "
            "HINT: return endless training batches",
        ),
        (
            "from paced_keras3 import build_model, dataset\n"
            "def layout_map(devices, params):\n"
            "    return {'dense/kernel': (None, 'model')}\n",
            "mine.layout_map(devices, params) returned 'dict', not a "
            "keras.distribution.LayoutMap. HINT: return keras.distribution.LayoutMap(",
        ),
        (
            "from paced_keras3 import build_model, dataset\nlayout_map = {}\n",
            "defines layout_map, but not as a function. HINT: define layout_map(devices, params)",
        ),
        # The newcomer's (#53): Keras's own error was 47 lines, then a traceback.
        (
            "build_model = paced_keras3.build_model\n"
            "def dataset(mode, params):\n"
            "    for x, y in paced_keras3.dataset(mode, params):\n"
            "        yield {'features': x, 'label': y}\n",
            "mine.dataset('train', params) yields batches of dict of 'features', 'label', not "
            "(inputs, targets). HINT: return a generator of (inputs, targets) batches",
        ),
        (
            "build_model = paced_keras3.build_model\n"
            "def dataset(mode, params):\n"
            "    import tensorflow_not_here as tf\n",
            "mine.dataset('train', params) imports tensorflow_not_here, which this Python does "
            "not have. HINT: yield numpy batches",
        ),
    ],
    ids=[
        "uncompiled",
        "arrays",
        "finite",
        "layout-map-dict",
        "layout-map-no-function",
        "dicts",
        "tensorflow",
    ],
)
def test_what_a_keras3_experiment_cannot_train_is_one_line(
    tmp_path: Path, source: str, said: str
) -> None:
    """Refused before a step, in one line, exit 2."""
    mine = tmp_path / "mine.py"
    mine.write_text(
        "import keras\nimport numpy as np\n"
        f"import importlib.util, sys\nsys.path.insert(0, {str(PACED_KERAS3.parent)!r})\n"
        "import paced_keras3\nHPARAMS = paced_keras3.HPARAMS\n" + source
    )
    refused = train(tmp_path / "out", "--train_steps=5", experiment=str(mine))
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("tfconfig-slurm-run: --experiment: mine") and said in last, last
    assert "Traceback" not in refused.stderr
    if "not compiled" in said:
        # Refused before anything was written: no empty model directory is left.
        assert not (tmp_path / "out" / "mine").exists()


def test_a_single_process_that_failed_says_why_in_the_runs_table(tmp_path: Path) -> None:
    """A single process records no failure of a task: the error its run failed with is the
    reason the runs table gives, and no checkpoint is claimed where none was written."""
    mine = tmp_path / "mine.py"
    mine.write_text(
        "import keras\n"
        "from tests.fixtures.paced_keras3 import HPARAMS, build_model, dataset as endless\n"
        "def dataset(mode, params):\n"
        "    return endless('eval', params)\n"
    )
    failed = train(tmp_path / "out", "--train_steps=50", experiment=str(mine))
    assert failed.returncode == 2, failed.stderr[-3000:]
    said = run_module("tfconfig_slurm.commands", "runs", f"--run={tmp_path / 'out' / 'mine'}")
    assert said.stdout.strip() == (
        f"{tmp_path / 'out' / 'mine'}: failed (no checkpoint); first to fail: --experiment: "
        "mine.dataset('train', params) ran out at global step 4, before --train_steps=50. "
        "HINT: return endless training batches (e.g. loop over the data in a while True)"
    ), said.stdout + said.stderr


def test_a_task_reads_slurm_s_environment_once(tmp_path: Path) -> None:
    """The one task of a SLURM step, trained to its end: its job read once at the door, its
    step once where its place is found, and nothing below them reads either again (the
    lock, the time limit, the requeue check, the run's owner take the job handed down)."""
    reads = tmp_path / "reads.txt"
    environ = {
        **task_env(["localhost"], [1], 0, job_id=91),
        "SLURM_READS": str(reads),
        "PYTHONPATH": str(REPOSITORY),
        "PACED_KERAS_PACE_MICROSECONDS": "0",
    }
    ran = run_module(
        "tests.fixtures.count_slurm_reads", f"--experiment={PACED_KERAS3}",
        f"--output_root={tmp_path}", "--train_steps=5", environ=environ, python=KERAS3_PYTHON,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "done at step 5" in ran.stderr
    assert reads.read_text().splitlines() == ["read_slurm_job", "read_slurm_step"]


def test_batches_of_no_sample_weights_are_placed_on_two_devices(tmp_path: Path) -> None:
    """The batches read ahead are placed as Keras would take them: (inputs, targets, None),
    its None left so (it raised AttributeError: 'NoneType' object has no attribute 'shape'),
    and the eval batches padded for 2 devices weigh 1 each (np.concatenate failed on None)."""
    mine = tmp_path / "mine.py"
    mine.write_text(
        "import keras\n"
        "from tests.fixtures.paced_keras3 import HPARAMS, build_model\n"
        "from tests.fixtures.paced_keras3 import dataset as _dataset\n"
        "def dataset(mode, params):\n"
        "    for features, labels in _dataset(mode, params):\n"
        "        yield features, labels, None\n"
    )
    ran = train(
        tmp_path / "out", "--train_steps=20", experiment=str(mine),
        environ={"XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                 "PYTHONPATH": str(REPOSITORY), "PACED_KERAS_PACE_MICROSECONDS": "0"},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "DataParallel on a mesh of batch 2" in ran.stderr
    assert json.loads((tmp_path / "out" / "mine" / "summary.json").read_text())["global_step"] == 20


def test_one_process_of_two_devices_evaluates_a_short_last_batch(tmp_path: Path) -> None:
    """#52: the digits' last eval batch of 39 does not split over 2 devices: every run of a
    process of several devices trained, then failed its evaluation (IndivisibleError). It is
    padded with examples that weigh 0."""
    ran = train(
        tmp_path,
        "--train_steps=20",
        environ={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "1 process and 2 devices on JAX, DataParallel on a mesh of batch 2" in ran.stderr
    summary = json.loads((tmp_path / "mnist_keras3" / "summary.json").read_text())
    assert summary["global_step"] == 20 and 0.3 < summary["eval"]["accuracy"] <= 1.0, summary


def test_a_batch_larger_than_the_process_s_data_is_one_line(tmp_path: Path) -> None:
    """#53: --batch_size=2000 on the digits (1438 to train) spun at full CPU until killed."""
    refused = train(tmp_path, "--batch_size=2000", "--train_steps=5", timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "tfconfig-slurm-run: --experiment: mnist_keras3.dataset('train', params) refused them: "
        "params['batch_size'] is 2000, more than this trainer's share of the training data "
        "(1438 examples, one in 1), which then makes no batch. HINT: change what it names (e.g. "
        "--batch_size), or its data"
    )


def test_a_truncated_latest_checkpoint_is_skipped_and_the_run_resumes_from_the_one_before(
    tmp_path: Path,
) -> None:
    """#52: a node that crashes as its chief writes a checkpoint can leave it truncated (the
    rename reaching the disk before the data); the resume skips it, named, and goes on from the
    newest that reads, where it was a traceback and a run that could not resume."""
    environ = {"PACED_KERAS_PACE_MICROSECONDS": "0"}
    flags = ("--save_checkpoints_steps=10", f"--experiment={PACED_KERAS3}")
    first = run_module(RUN, f"--output_root={tmp_path}", "--train_steps=20", *flags,
                       python=KERAS3_PYTHON, environ=environ)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    model_dir = tmp_path / "paced_keras3"
    os.truncate(model_dir / "ckpt-20.weights.h5", 100)
    resumed = run_module(RUN, f"--output_root={tmp_path}", "--train_steps=30", *flags,
                         python=KERAS3_PYTHON, environ=environ)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "skipped ckpt-20.weights.h5, which does not read (Unable to" in resumed.stderr
    assert "resuming from step 10;" in resumed.stderr
    assert "first step done (global step 11)" in resumed.stderr
    assert checkpoint_step(model_dir) == 30


@pytest.mark.parametrize(
    "per_call, lines", [(None, ["100", "200", "300"]), (7, ["105", "203", "300"])],
    ids=["a-step-a-call", "seven-steps-a-call"],
)  # fmt: skip
def test_a_run_s_steps_read_nothing_back_from_the_devices_but_at_its_lines(
    tmp_path: Path, per_call: int | None, lines: list[str]
) -> None:
    """#54: the training thread dispatches step after step without waiting for the devices. Its
    progress lines read the loss on a thread of their own, once a line; Keras reads the loss
    and the metric back twice as the fit's one epoch ends; nothing reads them each step, where
    it did twice (Keras's callback list, for a callback not async_safe: 604 reads in 300
    steps). A single process makes no collective decisions, and checkpoints after the fit."""
    reads = tmp_path / "reads.json"
    calls = [f"--steps_per_execution={per_call}"] if per_call else []
    ran = train(
        tmp_path, "--train_steps=300", "--log_every_steps=100", "--save_checkpoints_steps=1000",
        *calls, experiment=str(REPOSITORY / "tests" / "fixtures" / "counted_reads_keras3.py"),
        environ={
            "DEVICE_READS": str(reads),
            "PYTHONPATH": str(REPOSITORY),
            "PACED_KERAS_PACE_MICROSECONDS": "0",
        },
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.findall(r"step (\d+): loss [\d.]+, ", ran.stderr) == lines, ran.stderr[-3000:]
    assert f"first step done (global step {per_call or 1})" in ran.stderr
    assert json.loads(reads.read_text()) == {"training": 4, "elsewhere": len(lines) + 1}


def test_steps_per_execution_runs_calls_of_steps_that_end_at_train_steps(tmp_path: Path) -> None:
    """#54: 7 steps a call: a checkpoint falls on the first call's end at or after its step,
    and the last call runs the 2 steps left to 100, where the batches end (train._fed); a resume
    goes on from there. A tf.data or PyDataset experiment, whose batches do not end there, and
    another backend's, are refused in one line."""
    flags = ("--steps_per_execution=7", "--save_checkpoints_steps=30")
    ran = train(tmp_path, "--train_steps=100", *flags, experiment=str(PACED_KERAS3))
    assert ran.returncode == 0, ran.stderr[-3000:]
    model_dir = tmp_path / "paced_keras3"
    written = sorted(int(path.name[5:-11]) for path in model_dir.glob("ckpt-*.weights.h5"))
    assert written == [35, 63, 91, 100], ran.stderr[-3000:]
    assert json.loads((model_dir / "summary.json").read_text())["global_step"] == 100
    again = train(tmp_path, "--train_steps=110", *flags, experiment=str(PACED_KERAS3))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "first step done (global step 107)" in again.stderr, again.stderr[-3000:]
    assert (model_dir / "ckpt-110.weights.h5").exists()
    pydataset = tmp_path / "mine.py"
    pydataset.write_text(
        "import keras, numpy as np\n"
        "from tests.fixtures.paced_keras3 import HPARAMS, build_model\n"
        "class Batches(keras.utils.PyDataset):\n"
        "    def __len__(self): return 10\n"
        "    def __getitem__(self, index): return np.zeros((4, 4)), np.zeros((4,))\n"
        "def dataset(mode, params): return Batches()\n"
    )
    refused = train(
        tmp_path, "--train_steps=10", "--steps_per_execution=2", experiment=str(pydataset),
        environ={"PYTHONPATH": str(REPOSITORY)},
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "tfconfig-slurm-run: --steps_per_execution: mine.dataset('train', params) returned a "
        "Batches, which fit would read past --train_steps in a call of several steps. HINT: "
        "leave --steps_per_execution out, or yield the batches from a generator"
    )


def test_a_layout_map_whose_mesh_leaves_out_devices_is_one_line(tmp_path: Path) -> None:
    """One process of 2 devices (XLA's host platform split in two), a mesh of the first."""
    mine = tmp_path / "mine.py"
    mine.write_text(
        "import keras\n"
        "from tests.fixtures.sharded_keras3 import HPARAMS, build_model, dataset\n"
        "def layout_map(devices, params):\n"
        "    mesh = keras.distribution.DeviceMesh((1, 1), ['batch', 'model'], devices[:1])\n"
        "    return keras.distribution.LayoutMap(mesh)\n"
    )
    refused = train(
        tmp_path / "out", "--train_steps=5", experiment=str(mine),
        environ={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "tfconfig-slurm-run: --experiment: mine.layout_map's mesh holds 1 of the run's 2 "
        "devices. HINT: build its DeviceMesh of every device layout_map is given, e.g. shape "
        "(2 // model_shards, model_shards)"
    )


def test_a_checkpoint_another_backend_wrote_is_one_line(tmp_path: Path) -> None:
    """A model directory a tf-keras run left (its index names ckpt-10, no .weights.h5): not
    a traceback from h5py (history.check_resumable, as every backend)."""
    model_dir = tmp_path / "paced_keras3"
    model_dir.mkdir()
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    refused = train(tmp_path, "--train_steps=20", experiment=str(PACED_KERAS3))
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        f"tfconfig-slurm-run: --experiment_id: names {model_dir}, whose latest checkpoint "
        "(ckpt-10) is tf-keras's, not Keras 3's: another backend trained it. HINT: give this "
        "run its own --experiment_id (or EXPERIMENT_ID)"
    )


def test_a_signal_to_one_process_stops_every_process_at_one_step(tmp_path: Path) -> None:
    """SIGUSR1 reaches the worker only: the chief learns it at the next agreement, both save
    the same step and exit 0 (no SLURM job to requeue), and the chief says the run stopped on
    SIGUSR1, the signal that requeues."""
    stopped_together_by_the_worker(
        tmp_path,
        lambda kind, cluster: trainer(
            tmp_path, cluster, kind, "--train_steps=100000", "--log_every_steps=1"
        ),
        "paced_keras3",
        after="step 3: loss",
    )


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        # An evaluator gave process id 1 of 1 process, which JAX refused only later.
        (
            {"TFCONFIG_SLURM_EVALUATOR": "1"},
            "python: TFCONFIG_SLURM_EVALUATOR: lays out other tasks than trainers, and "
            "keras_distribution() gives one JAX process a task, all of them training. HINT: "
            "unset TFCONFIG_SLURM_EVALUATOR: keras_distribution() lays the step out as "
            "--all_reduce does",
        ),
        (
            {"TFCONFIG_SLURM_PS_PER_NODE": "two"},
            "python: TFCONFIG_SLURM_PS_PER_NODE: is 'two', expected",
        ),
    ],
)
def test_keras_distribution_s_bad_settings_are_one_line(
    tmp_path: Path, variables: dict[str, str], line: str
) -> None:
    """The helper's findings: each was a traceback in every task, or (the evaluator) values
    keras.distribution.initialize then refused."""
    called = subprocess.run(
        [str(KERAS3_PYTHON), "-c", "import tfconfig_slurm; tfconfig_slurm.keras_distribution()"],
        env={"PATH": os.environ["PATH"], **task_env(["localhost"], [2], 1), **variables},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert called.returncode == 2, called.stderr[-3000:]
    assert called.stderr.count("\n") == 1 and called.stderr.startswith(line), called.stderr


def test_the_cluster_resolver_without_tensorflow_is_one_line() -> None:
    """The helper's finding: in the Keras 3 environment, a traceback ending in InstallError."""
    called = subprocess.run(
        [str(KERAS3_PYTHON), "-c", "import tfconfig_slurm; tfconfig_slurm.cluster_resolver()"],
        env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert called.returncode == 2, called.stderr[-3000:]
    assert called.stderr.count("\n") == 1 and called.stderr.startswith(
        "python: tfconfig_slurm.cluster_resolver: needs TensorFlow"
    ), called.stderr


def test_with_tfconfig_keras3_runs_the_user_s_own_sitecustomize_once(tmp_path: Path) -> None:
    """The boot folder's sitecustomize, first on the command's PYTHONPATH, hides the user's:
    it runs it, once; and JAX's CPU backend, once JAX is imported, is the one with gloo on
    the task's address."""
    own = tmp_path / "own"
    own.mkdir()
    # Said with the process id keras.distribution reads: the command's, not the wrapper's
    # own Pythons' (they have the user's PYTHONPATH too).
    (own / "sitecustomize.py").write_text(
        "import os\nprint('my sitecustomize ran in', "
        "os.environ.get('KERAS_DISTRIBUTION_PROCESS_ID', 'the wrapper'), flush=True)\n"
    )
    script = (
        "import jax\nfrom jax._src import xla_bridge\n"
        "print(xla_bridge._backend_factories['cpu'].factory.__module__)\n"
    )
    ran = subprocess.run(
        [str(WITH_TFCONFIG), f"--port_base={free_port_block(4)}", "--keras3", str(KERAS3_PYTHON),
         "-c", script],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": str(KERAS3_PYTHON),
             "PYTHONPATH": str(own), **task_env(["localhost"], [4], 3)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    command = [line for line in ran.stdout.splitlines() if "the wrapper" not in line]
    assert command == ["my sitecustomize ran in 3", "tfconfig_slurm.backends.keras3.gloo"]


def test_a_resume_with_another_learning_rate_trains_with_it(tmp_path: Path) -> None:
    """state.json says the hparams changed; the optimizer's own rate, which the checkpoint
    holds too, follows them (in the checkpoint written after the resume)."""
    first = train(tmp_path, "--train_steps=10", experiment=str(PACED_KERAS3))
    assert first.returncode == 0, first.stderr[-3000:]
    again = train(
        tmp_path, "--train_steps=20", "--hparams=learning_rate=0.1", experiment=str(PACED_KERAS3)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(learning_rate: 0.5 -> 0.1)" in again.stderr
    with h5py.File(tmp_path / "paced_keras3" / "ckpt-20.weights.h5") as checkpoint:
        # The optimizer's variables: its iterations, then its learning rate.
        assert checkpoint["optimizer/vars/0"][()] == 20
        assert checkpoint["optimizer/vars/1"][()] == pytest.approx(0.1)


def test_a_single_process_told_to_stop_during_its_evaluation_stops(tmp_path: Path) -> None:
    """An eval set that never ends (the docs ask for a finite one) holds the final evaluation;
    SIGTERM ends it at its next batch, as a stop: state.json says so, the step's checkpoint
    is kept, and a resume would evaluate again."""
    mine = tmp_path / "endless.py"
    mine.write_text(
        "import keras\nimport sys\n"
        f"sys.path.insert(0, {str(PACED_KERAS3.parent)!r})\n"
        "import paced_keras3\nHPARAMS = paced_keras3.HPARAMS\n"
        "build_model = paced_keras3.build_model\n"
        "def dataset(mode, params):\n"
        "    return paced_keras3.dataset('train', params)\n"
    )
    process, console = start(tmp_path, f"--experiment={mine}", "--train_steps=5")
    seen = wait_until(lambda: "checkpoint of step 5 written" in console.read_text(), START_SECONDS)
    assert seen, console.read_text()[-3000:]
    process.send_signal(signal.SIGTERM)
    assert ended(process) == 0, console.read_text()[-3000:]
    assert "stopping on SIGTERM during the evaluation" in console.read_text()
    state = json.loads((tmp_path / "endless" / "state.json").read_text())
    assert (state["state"], state["signal"], state["global_step"]) == ("stopped", "SIGTERM", 5)

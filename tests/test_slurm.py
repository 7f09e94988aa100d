"""End to end on the real SLURM test cluster, on its partition debug: 3 nodes x 4 CPUs x 2 fake
GPUs, each node its own network stack (tests/slurm/cluster). The commands are the ones a user
types."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests import fake_backend
from tests.cli import (
    PACED,
    REPOSITORY,
    checkpoint_step,
    tensorboard,
    wait_for,
    wait_until,
)
from tests.slurm_cluster import (
    CALL_SECONDS,
    ONE_TASK,
    SBATCH,
    SMALL_JOB,
    SlurmCluster,
    finish,
    job_id_of,
    submit,
)

pytestmark = pytest.mark.slurm

WITH_TFCONFIG = REPOSITORY / "launch" / "with-tfconfig"
# A stock premade-Estimator script: its parameter servers never return by themselves.
PREMADE = REPOSITORY / "tests" / "fixtures" / "premade_estimator.py"
# The same script changed in one line: it calls tfconfig_slurm.train_and_evaluate.
ONE_IMPORT = REPOSITORY / "tests" / "fixtures" / "one_import_estimator.py"
# 2 nodes x (1 ps + 1 trainer), no GPUs: ps 0 and the chief on the first node, ps 1 and
# worker 0 on the second.
TWO_BY_TWO = ("--nodes=2", "--ntasks-per-node=2")
# The tests of the runs table and the claim train the fake backend (tests/fake_backend.py).
FAKE = fake_backend.environ()


def by_rank(output: str) -> dict[int, list[str]]:
    """srun --label output: each task's lines, by rank."""
    lines = collections.defaultdict(list)
    for line in output.splitlines():
        rank, _, text = line.partition(": ")
        lines[int(rank)].append(text)
    return dict(lines)


def test_every_task_of_a_gpu_step_agrees_on_one_cluster(slurm_cluster: SlurmCluster) -> None:
    task = (
        'echo "node=$SLURMD_NODENAME slurm_gpus=$CUDA_VISIBLE_DEVICES"; '
        "python -m tfconfig_slurm.tfconfig --export; getent hosts node1 node2 node3"
    )
    step = slurm_cluster.run(
        ["srun", "--nodes=3", "--ntasks-per-node=3", "--gres=gpu:2", "--label", "bash", "-c", task]
    )
    assert step.returncode == 0, step.stderr
    tasks = by_rank(step.stdout)
    assert sorted(tasks) == list(range(9))
    clusters: set[str] = set()
    roles: collections.Counter[str] = collections.Counter()
    gpus_taken: dict[str, list[str]] = collections.defaultdict(list)
    for lines in tasks.values():
        node, slurm_gpus = lines[0].removeprefix("node=").split(" slurm_gpus=")
        exports = dict(re.findall(r"export (\w+)='?([^'\n]*)'?", "\n".join(lines)))
        tf_config = json.loads(exports["TF_CONFIG"])
        clusters.add(json.dumps(tf_config["cluster"], sort_keys=True))
        role = tf_config["task"]["type"]
        roles[role] += 1
        own_address = tf_config["cluster"][role][tf_config["task"]["index"]]
        assert own_address.startswith(f"{node}:")
        if role == "ps":
            assert exports["CUDA_VISIBLE_DEVICES"] == ""
        else:
            # One of the GPUs SLURM gave this node's tasks, and no other trainer's.
            assert exports["CUDA_VISIBLE_DEVICES"] in slurm_gpus.split(",")
            gpus_taken[node].append(exports["CUDA_VISIBLE_DEVICES"])
        # From inside this node's network stack, every node's name resolves to its address.
        resolved = dict(line.split()[::-1] for line in lines if line.startswith("10.251."))
        assert resolved == {name: f"10.251.0.1{name[-1]}" for name in slurm_cluster.nodes}
    assert len(clusters) == 1
    assert roles == {"chief": 1, "ps": 3, "worker": 5}
    assert {node: sorted(gpus) for node, gpus in gpus_taken.items()} == {
        node: ["0", "1"] for node in slurm_cluster.nodes
    }


def test_with_tfconfig_exports_the_task_s_place(slurm_cluster: SlurmCluster) -> None:
    show = (
        "import json, os; "
        "print(json.dumps([os.environ.get(n) for n in ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES')]))"
    )
    step = slurm_cluster.run(
        ["srun", *SMALL_JOB, "--label", str(WITH_TFCONFIG), "python", "-c", show]
    )
    assert step.returncode == 0, step.stderr
    seen = {}
    for rank, lines in by_rank(step.stdout).items():
        tf_config, gpus = json.loads(lines[-1])
        task = json.loads(tf_config)["task"]
        seen[rank] = (task["type"], task["index"], gpus)
    assert seen == {
        0: ("ps", 0, ""),
        1: ("chief", 0, "0"),
        2: ("ps", 1, ""),
        3: ("worker", 0, "0"),
    }


def test_an_inherited_tf_config_and_gpus_do_not_decide_a_task_s_place(
    slurm_cluster: SlurmCluster,
) -> None:
    """Exported in the shell that runs srun, on a step without GPUs: srun passes both on."""
    show = (
        "import json, os; "
        "print(json.dumps([os.environ.get(n) for n in ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES')]))"
    )
    inherited = '{"cluster": {"chief": ["elsewhere:1"]}, "task": {"type": "chief", "index": 0}}'
    step = slurm_cluster.run(
        ["srun", "--nodes=2", "--ntasks-per-node=2", "--label", str(WITH_TFCONFIG), "python",
         "-c", show],
        TF_CONFIG=inherited,
        CUDA_VISIBLE_DEVICES="0,1",
    )  # fmt: skip
    assert step.returncode == 0, step.stderr
    seen = {}
    for rank, lines in by_rank(step.stdout).items():
        tf_config, gpus = json.loads(lines[-1])
        config = json.loads(tf_config)
        assert re.fullmatch(r"\d+\.0\.0", config["tfconfig_slurm"]["run"])
        seen[rank] = (config["task"]["type"], config["task"]["index"], gpus)
    assert seen == {0: ("ps", 0, ""), 1: ("chief", 0, ""), 2: ("ps", 1, ""), 3: ("worker", 0, "")}
    assert step.stderr.count("TF_CONFIG: set, but made elsewhere") == 4


def test_two_jobs_on_one_id_the_second_stops_at_start_naming_the_first(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The second is submitted once the first holds the run: its batch script stops before
    srun, in one line, exit 2 (it used to say so after srun's noise, exit 143)."""
    endless = (f"--experiment={PACED}", "--train_steps=1000000")
    first = submit(
        slurm_cluster, tmp_path, "shared", *endless, sbatch_options=("--nodes=1",), environ=FAKE
    )
    try:
        assert wait_until((tmp_path / "shared" / "run.lock").exists, 300)
        first_id = job_id_of(tmp_path / "shared" / "logs")
        loser = finish(
            slurm_cluster,
            submit(
                slurm_cluster,
                tmp_path,
                "shared",
                *endless,
                sbatch_options=("--nodes=1",),
                environ=FAKE,
            ),
        )
    finally:
        slurm_cluster.cancel_all()
        first.wait(timeout=60)
    assert (loser["JobState"], loser["ExitCode"]) == ("FAILED", "2:0")
    output = (tmp_path / f"train-{loser['JobId']}.out").read_text()
    assert output.startswith(
        f"tfconfig-slurm-run: --experiment_id: {tmp_path / 'shared'} is held by another run, "
        f"SLURM job {first_id}"
    ), output
    assert output.count("\n") == 1 and "HINT: " in output, output


def test_a_step_every_task_refuses_names_the_node_of_the_first_to_fail(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Three trainers a node for its two GPUs: every task refuses the layout (exit 2), each of
    its own node, and the .out's line names the node srun named (a newcomer's said node1 for
    tasks that ran on node2)."""
    job = finish(
        slurm_cluster,
        submit(slurm_cluster, tmp_path, "crowded", f"--experiment={PACED}",
               sbatch_options=("--ntasks-per-node=4", "--gres=gpu:2")),
    )  # fmt: skip
    # Bad input's status, not srun's 143 where it names a task it killed after the first.
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "2:0"), job["ExitCode"]
    output = (tmp_path / f"train-{job['JobId']}.out").read_text()
    said = re.search(
        r"first to fail: (node\d): tasks? [\d,-]+: Exited with exit code 2; its last line: "
        r".*GPUs of node (node\d): the node has 2 GPUs \(0,1\) for its 3 trainers",
        output,
    )
    assert said and said.group(1) == said.group(2), output


def test_a_lock_left_by_a_job_that_ended_is_taken_over(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "stale").mkdir()
    gone = {"job": "999999", "host": "node1", "pid": 1}
    (tmp_path / "stale" / "run.lock").write_text(json.dumps(gone))
    job = finish(
        slurm_cluster,
        submit(
            slurm_cluster, tmp_path, "stale", f"--experiment={PACED}", "--train_steps=10",
            environ=FAKE,
        ),
    )  # fmt: skip
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), job["stderr"]
    assert checkpoint_step(tmp_path / "stale") >= 10


def test_array_tasks_train_their_own_experiment_into_their_own_directories(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """No EXPERIMENT_ID: the id follows --experiment, and each array task gets its own. The
    paced experiment, as a file of the submit directory, on the fake backend."""
    shutil.copy(PACED, tmp_path / "digits.py")
    # Not sbatch --wait, which looks every 10 s.
    submitted = slurm_cluster.run(
        ["sbatch", "--parsable", "--array=0-1", *ONE_TASK, str(SBATCH),
         "--experiment=digits.py", "--train_steps=10"],
        tmp_path,
        CALL_SECONDS,
        TFCONFIG_SLURM_OUTPUT=str(tmp_path),
        **FAKE,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert wait_until(lambda: not queued(slurm_cluster, submitted.stdout.strip()), 300)
    assert sorted(path.name for path in tmp_path.glob("digits-*")) == ["digits-0", "digits-1"]
    for index in (0, 1):
        assert checkpoint_step(tmp_path / f"digits-{index}") >= 10
        state = json.loads((tmp_path / f"digits-{index}" / "state.json").read_text())
        assert state["state"] == "done", state
    assert not (tmp_path / "mnist_deep").exists()


def test_a_stock_estimator_script_under_with_tfconfig_ends_by_itself(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Its parameter server sits in server.join(): the wrapper ends it once the chief's script
    has returned, and the plain srun step completes. (The parameter servers of several nodes,
    and trees of trainers, end alike: test_with_tfconfig, without TensorFlow.)"""
    step = slurm_cluster.run(
        ["srun", "--nodes=1", "--ntasks=2", "--label", str(WITH_TFCONFIG), "python",
         str(PREMADE), str(tmp_path / "model"), "200"],
    )  # fmt: skip
    assert step.returncode == 0, step.stderr[-3000:]
    assert step.stdout.count("train_and_evaluate returned") == 1
    assert "ps 0: every trainer finished; ending its command" in step.stderr
    assert checkpoint_step(tmp_path / "model") == 200
    assert left_behind(slurm_cluster) == {node: [] for node in slurm_cluster.nodes}


def test_a_one_import_script_under_plain_srun_trains_as_a_cluster_and_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """No wrapper and no TF_CONFIG: each task takes its place from SLURM, the parameter servers
    exit by themselves, and only the chief returns the final metrics."""
    model_dir = tmp_path / "model"
    command = ["srun", *TWO_BY_TWO, "--label", "python", str(ONE_IMPORT), str(model_dir)]
    step = slurm_cluster.run([*command, "200"])
    assert step.returncode == 0, step.stderr[-3000:]
    [returned] = re.findall(r"^(\d+): returned (\{.*\})$", step.stdout, re.M)
    rank, metrics = int(returned[0]), json.loads(returned[1])
    logs = by_rank(step.stderr)
    assert any(re.search(r"chief 0 on node\d", line) for line in logs[rank])
    for ps in ("ps 0", "ps 1"):
        assert f"{ps}: 2 of 2 trainers finished" in step.stderr
    assert "CUDA_VISIBLE_DEVICES: set to" not in step.stderr
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == metrics["global_step"] >= 200
    assert {trainer["role"] for trainer in summary["trainers"]} == {"chief", "worker"}
    assert {trainer["run"] for trainer in summary["trainers"]} == {summary["trainers"][0]["run"]}
    # The script's RunConfig keeps 2 checkpoints; the cluster did not change that.
    assert len(list(model_dir.glob("model.ckpt-*.index"))) == 2
    assert left_behind(slurm_cluster) == {node: [] for node in slurm_cluster.nodes}
    reached = checkpoint_step(model_dir)
    # Resumed by a script that ran a TensorFlow op first: too late for CUDA_VISIBLE_DEVICES.
    # On one node, a ps and the chief: the checkpoint does not depend on the layout.
    one_node = ["srun", "--nodes=1", "--ntasks=2", "--label", "python", str(ONE_IMPORT)]
    again = slurm_cluster.run([*one_node, str(model_dir), "300"], EARLY_OP="1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("CUDA_VISIBLE_DEVICES: set to [] for this task after") == 2
    resumed = re.search(r"chief 0 on node\d at .* resuming from step (\d+)$", again.stderr, re.M)
    # A checkpoint may hold a step or two past its name: asynchronous workers move the ps's
    # global step while the chief writes it (as in test_faults).
    assert resumed is not None and reached <= int(resumed.group(1)) <= reached + 2, again.stderr
    assert checkpoint_step(model_dir) >= 300


def left_behind(cluster: SlurmCluster) -> dict[str, list[str]]:
    """What jobs left on the nodes, after the few hundred ms slurmd takes to reap a step."""
    wait_until(lambda: not any(cluster.task_pids().values()), 5.0)
    return cluster.task_pids()


@pytest.fixture(scope="module")
def first_job(
    slurm_conf: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    slurm_cluster = SlurmCluster(slurm_conf)
    workdir = tmp_path_factory.mktemp("sbatch")
    job = submit(slurm_cluster, workdir, "e2e", "--train_steps=30", "--save_checkpoints_steps=15")
    return workdir, finish(slurm_cluster, job)


TASKS = ("task0", "task1", "task2", "task3")


def test_sbatch_trains_to_the_end_and_leaves_nothing_behind(
    slurm_cluster: SlurmCluster, first_job: tuple[Path, dict[str, str]]
) -> None:
    workdir, job = first_job
    model_dir = workdir / "e2e"
    task_logs = sorted(path.name for path in (model_dir / "logs").iterdir())
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), (
        job["stderr"],
        [(model_dir / "logs" / name).read_text()[-2000:] for name in task_logs],
    )
    assert left_behind(slurm_cluster) == {node: [] for node in slurm_cluster.nodes}
    assert checkpoint_step(model_dir) >= 30
    summary = json.loads((model_dir / "summary.json").read_text())
    # The step stored in a checkpoint may be a step or two past its name: the worker moves
    # the ps's global step while the chief writes it (seen: ckpt-31 held 32).
    assert checkpoint_step(model_dir) <= summary["global_step"] <= checkpoint_step(model_dir) + 2
    # The job's .out says which run it trains, and, last, how it ended and where to look.
    output = (workdir / f"train-{job['JobId']}.out").read_text().splitlines()
    assert f"{model_dir}: a new run, to step 30" in output
    assert re.fullmatch(
        rf"{model_dir}: done at step {summary['global_step']}: accuracy=[\d.]+,loss=[\d.]+.*; "
        rf"summary in {model_dir}/summary.json; task logs in {model_dir}/logs",
        output[-1],
    ), output[-5:]
    assert {trainer["role"] for trainer in summary["trainers"]} == {"chief", "worker"}
    # The job's first step, its first attempt: the run every report of this job carries.
    assert {trainer["run"] for trainer in summary["trainers"]} == {f"{job['JobId']}.0.0"}
    assert task_logs == [f"job{job['JobId']}-{name}.log" for name in TASKS]
    starts = "".join((model_dir / "logs" / name).read_text() for name in task_logs)
    # Each node runs a ps and a trainer, the chief on the first: whichever nodes Slurm chose.
    nodes = {
        task: re.findall(rf"{task} on (node\d)", starts)
        for task in ("ps 0", "chief 0", "ps 1", "worker 0")
    }
    assert nodes["ps 0"] == nodes["chief 0"] != nodes["ps 1"] == nodes["worker 0"], nodes


def test_resubmitting_the_same_id_resumes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The job's and the run's part, on the fake backend: the id, the claim, the history line
    of the .out. Estimator's own resume from its checkpoint keeps its tests (test_faults,
    test_local_cluster, test_run)."""
    paced = (f"--experiment={PACED}", "--save_checkpoints_steps=15")
    first = finish(
        slurm_cluster,
        submit(slurm_cluster, tmp_path, "e2e", *paced, "--train_steps=30", environ=FAKE),
    )
    assert (first["JobState"], first["ExitCode"]) == ("COMPLETED", "0:0"), first["stderr"]
    model_dir = tmp_path / "e2e"
    reached = checkpoint_step(model_dir)
    assert reached == 30
    job = finish(
        slurm_cluster,
        submit(slurm_cluster, tmp_path, "e2e", *paced, "--train_steps=60", environ=FAKE),
    )
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), job["stderr"]
    chief_log = (model_dir / "logs" / f"job{job['JobId']}-task1.log").read_text()
    assert re.search(r"chief 0 on (node\d) at \1:", chief_log)
    assert f"resuming from step {reached}" in chief_log
    assert checkpoint_step(model_dir) >= 60
    output = (tmp_path / f"train-{job['JobId']}.out").read_text()
    assert re.search(
        rf"{model_dir}: resumes the run at step {reached}, to step 60 \(last trained by job "
        rf"{first['JobId']} at [\d-]+ [\d:]+, done\)\n",
        output,
    ), output


def test_two_jobs_on_the_same_nodes_at_once_both_complete(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Their tasks' ports differ: each task of the fake backend answers on its own, as a
    TensorFlow server listens on it."""
    jobs = [
        submit(
            slurm_cluster,
            tmp_path,
            name,
            f"--experiment={PACED}",
            # 3 s of training (one trainer a job): the two, started together, overlap.
            "--train_steps=60",
            nodes="node2",
            sbatch_options=("--nodes=1",),
            environ=FAKE,
        )
        for name in ("first", "second")
    ]
    ended = [finish(slurm_cluster, job) for job in jobs]
    assert [(job["JobState"], job["ExitCode"]) for job in ended] == [("COMPLETED", "0:0")] * 2, [
        job["stderr"] for job in ended
    ]
    # They overlapped on the same nodes: each started before the other ended.
    assert (
        ended[0]["StartTime"] <= ended[1]["EndTime"]
        and ended[1]["StartTime"] <= ended[0]["EndTime"]
    )
    assert {job["NodeList"] for job in ended} == {"node2"}
    for name in ("first", "second"):
        assert checkpoint_step(tmp_path / name) == 60


SWEEP = REPOSITORY / "launch" / "sweep"
# One process a run: the three runs of a sweep train side by side.
ONE_TASK_A_RUN = tuple(f"--sbatch_option={option}" for option in ONE_TASK)


def runs_table(cluster: SlurmCluster, root: Path) -> list[dict[str, Any]]:
    table = cluster.run(["python", "-m", "tfconfig_slurm.commands", "runs", str(root), "--json"])
    assert table.returncode == 0, table.stderr
    runs: list[dict[str, Any]] = json.loads(table.stdout)
    return runs


def queued(cluster: SlurmCluster, job: str) -> bool:
    return bool(cluster.run(["squeue", "--noheader", "--jobs", job]).stdout.strip())


def test_a_sweep_of_three_lines_trains_three_runs_that_the_table_and_tensorboard_list(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "lr.sweep").write_text(
        "# three learning rates\nlearning_rate=0.001\nlearning_rate=0.002,dropout=0.3\n"
        "learning_rate=0.004\n"
    )
    submitted = slurm_cluster.run(
        [str(SWEEP), *ONE_TASK_A_RUN, "lr.sweep", "--train_steps=10", "--log_every_steps=5"],
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    assert wait_until(lambda: not queued(slurm_cluster, job), 300)
    root = tmp_path / "tf-output"
    runs = runs_table(slurm_cluster, root)
    assert [(run["experiment_id"], run["state"], run["global_step"]) for run in runs] == [
        (f"lr-{index}", "done", 10) for index in range(3)
    ], [(run["experiment_id"], run["state"]) for run in runs]
    assert [run["job_id"] for run in runs] == [f"{job}_{index}" for index in range(3)]
    # One name for each array task: its .out's, its first line's, its task logs'.
    for index in range(3):
        said = (tmp_path / f"lr-{job}_{index}.out").read_text()
        assert f"lr: job {job}_{index} on " in said, said
        assert (root / f"lr-{index}" / "logs" / f"job{job}_{index}-task0.log").exists()
    assert [(run["hparams"]["learning_rate"], run["hparams"]["dropout"]) for run in runs] == [
        (0.001, 0.5),
        (0.002, 0.3),
        (0.004, 0.5),
    ]
    assert [run["eval"]["global_step"] for run in runs] == [10] * 3
    # TensorBoard's HParams dashboard: one session a run, with its hparams and eval metrics.
    with tensorboard(root) as url:
        request = urllib.request.Request(
            f"{url}data/plugin/hparams/session_groups",
            data=json.dumps(
                {"allowedStatuses": ["STATUS_UNKNOWN"], "startIndex": 0, "sliceSize": 100}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            groups = json.load(response)["sessionGroups"]
    sessions = {
        group["sessions"][0]["name"]: (group["hparams"], group["metricValues"]) for group in groups
    }
    assert sorted(sessions) == ["lr-0", "lr-1", "lr-2"]
    assert sessions["lr-1"][0]["learning_rate"] == pytest.approx(0.002)
    assert sessions["lr-1"][0]["dropout"] == pytest.approx(0.3)
    metrics = {(value["name"]["group"], value["name"]["tag"]) for value in sessions["lr-1"][1]}
    assert ("eval", "accuracy") in metrics


def test_the_runs_table_follows_a_run_through_running_requeued_stopped_and_failed(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    endless = (f"--experiment={PACED}", "--train_steps=1000000", "--save_checkpoints_steps=20")
    # Two runs at once, a node each: one stopped, one killed (and not restarted in its job).
    job, other = (
        submit(
            slurm_cluster, tmp_path, name, *endless, *extra, nodes=node,
            sbatch_options=("--nodes=1",), environ=FAKE,
        )
        for name, node, extra in (
            ("long", "node1", ()), ("killed", "node2", ("--max_restarts=0",))
        )
    )  # fmt: skip
    root = tmp_path

    def listed(name: str) -> dict[str, Any]:
        return next(run for run in runs_table(slurm_cluster, root) if run["experiment_id"] == name)

    def state(name: str) -> str:
        return str(listed(name)["state"])

    assert wait_until((tmp_path / "long" / "checkpoint").exists, 300)
    job_id = job_id_of(tmp_path / "long" / "logs")
    assert state("long") == "running"
    slurm_cluster.run(["scancel", "--signal=USR1", job_id])
    # Requeued: the job waits (Slurm holds a requeued job a while) to resume from its checkpoint.
    assert wait_until(lambda: state("long") == "requeued", 120)
    # The job's .out says so last (its requeue ended the batch script).
    output = tmp_path / f"train-{job_id}.out"
    standing = rf"long: stopped at step \d+ \(SIGUSR1\) and requeued: job {job_id} resumes it"
    assert wait_for(output.read_text, standing, 30)
    slurm_cluster.run(["scancel", job_id])
    assert wait_until(lambda: not queued(slurm_cluster, job_id), 60)
    # Stopped on SIGUSR1, and then cancelled in the queue: SLURM's word comes first.
    said = listed("long")
    assert (said["state"], said["stopped_by"], said["ended_by"]) == (
        "stopped",
        "SIGUSR1",
        "cancelled",
    )
    # The other run, whose chief is killed outright (as by the OOM killer), never says it
    # ended: the table says failed once its job has ended.
    assert wait_until((tmp_path / "killed" / "checkpoint").exists, 300)
    other_id = job_id_of(tmp_path / "killed" / "logs")
    os.kill(slurm_cluster.task_pid(1, job_id=other_id), signal.SIGKILL)
    assert wait_until(lambda: not queued(slurm_cluster, other_id), 60)
    assert state("killed") == "failed"
    for submitted in (job, other):
        submitted.wait(timeout=60)


def test_a_heterogeneous_step_trains_with_its_parameter_server_on_the_cpu_component(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """srun's ':' makes a heterogeneous job: a CPU task on node1, and a GPU node whose two
    tasks train. The explanation comes from a task that sees the GPUs; the run (of the fake
    backend) trains with its ps on node1 and a trainer on each GPU."""
    explain = ["python", "-m", "tfconfig_slurm.tfconfig", "--explain", "--json"]
    planned = slurm_cluster.run(
        ["srun", "--nodelist=node1", "-N1", "-n1", *explain, ":",
         "--nodelist=node2", "-N1", "-n2", "--gres=gpu:2", *explain],
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    tasks = json.loads(planned.stdout)
    assert [(task["node"], task["role"], task["gpus"]) for task in tasks] == [
        ("node1", "ps", []),
        ("node2", "chief", ["0"]),
        ("node2", "worker", ["1"]),
    ]
    train = [
        "env", *(f"{name}={value}" for name, value in FAKE.items()),
        "python", "-m", "tfconfig_slurm.run", f"--experiment={PACED}", "--train_steps=20",
        f"--output_root={tmp_path}",
    ]  # fmt: skip
    trained = slurm_cluster.run(
        ["srun", "--nodelist=node1", "-N1", "-n1", *train, ":",
         "--nodelist=node2", "-N1", "-n2", "--gres=gpu:2", *train],
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((tmp_path / "paced" / "summary.json").read_text())
    assert [address.split(":")[0] for address in summary["layout"]["ps"]] == ["node1"]
    assert summary["global_step"] >= 20
    assert slurm_cluster.left_behind() == {}

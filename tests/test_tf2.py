"""TensorFlow 2.16+ with tf-keras, in its own environment (.venv-tf2, Python 3.12): the
Estimator runtime refuses it in one line, and stock MultiWorkerMirroredStrategy and
ParameterServerStrategy scripts run under with-tfconfig on the real SLURM test cluster."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import tfconfig_slurm
from tests.cli import REPOSITORY
from tests.slurm_cluster import SlurmCluster, assert_restarted_once, wait_for_end
from tests.slurm_envs import captured
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step, render
from tfconfig_slurm.errors import UsageError

pytestmark = pytest.mark.tf2

WITH_TFCONFIG = REPOSITORY / "launch" / "with-tfconfig"
MWMS = REPOSITORY / "tests" / "fixtures" / "mwms_keras.py"
# One task on each of two nodes: the chief on the first, worker 0 on the second.
TWO_NODES = ("--nodes=2", "--ntasks-per-node=1")


def python(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_estimator_runtime_on_tensorflow_2_16_plus_is_one_clear_error(tmp_path: Path) -> None:
    ran = python("-m", "tfconfig_slurm.run", "--experiment=mnist_deep", cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1 and not ran.stdout
    tensorflow = metadata.version("tensorflow")
    assert ran.stderr.startswith(
        "tfconfig-slurm-run: --experiment=mnist_deep (Estimator): needs TensorFlow 2.15, the last "
        f"release with Estimator, and this Python {sys.version_info[0]}.{sys.version_info[1]} "
        f"has TensorFlow {tensorflow}. HINT: install the Estimator extra"
    ), ran.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_one_import_api_on_tensorflow_2_16_plus_is_one_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import tfconfig_slurm\ntfconfig_slurm.train_and_evaluate\n")
    ran = python(str(script), cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1
    assert ran.stderr.startswith(
        "train.py: tfconfig_slurm.train_and_evaluate (Estimator): needs TensorFlow 2.15"
    ), ran.stderr


def reports(out: Path) -> dict[str, dict[str, float]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


@pytest.mark.slurm
def test_a_stock_multi_worker_mirrored_script_trains_all_reduce_under_with_tfconfig(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    step = slurm_cluster.run(
        ["srun", *TWO_NODES, "--label", str(WITH_TFCONFIG), "--all_reduce", "python", str(MWMS),
         str(tmp_path), "40"],
    )  # fmt: skip
    assert step.returncode == 0, step.stderr[-3000:]
    trained = reports(tmp_path)
    assert sorted(trained) == ["chief-0", "worker-0"], step.stderr[-3000:]
    assert {report["replicas"] for report in trained.values()} == {2}
    # All-reduce: both replicas end with the same weights.
    assert trained["chief-0"]["weights"] == pytest.approx(trained["worker-0"]["weights"])
    first, second = slurm_cluster.nodes
    assert f"rank 0 on {first} is chief 0" in step.stderr
    assert f"rank 1 on {second} is worker 0" in step.stderr
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_script_given_the_cluster_resolver_trains_all_reduce_under_plain_srun(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """No TF_CONFIG anywhere: the strategy takes its cluster from tfconfig_slurm's resolver."""
    step = slurm_cluster.run(
        ["srun", *TWO_NODES, "--label", "python", str(MWMS), str(tmp_path), "40"],
        MWMS_RESOLVER="1",
        PYTHONPATH=str(REPOSITORY),
    )  # fmt: skip
    assert step.returncode == 0, step.stderr[-3000:]
    trained = reports(tmp_path)
    assert sorted(trained) == ["chief-0", "worker-0"], step.stderr[-3000:]
    assert {report["replicas"] for report in trained.values()} == {2}
    assert trained["chief-0"]["weights"] == pytest.approx(trained["worker-0"]["weights"])


def test_the_cluster_resolver_is_the_task_s_place_in_the_core_s_layout() -> None:
    environ = captured("block_3x3_gres2", "task-4") | {"TF_CONFIG": "{}"}
    resolver = tfconfig_slurm.cluster_resolver(environ, coordinator=True)
    layout = lay_out_step(read_slurm_step(captured("block_3x3_gres2", "task-4")),
                          LayoutPolicy(coordinator=True))  # fmt: skip
    task = layout.task(4)
    assert (resolver.task_type, resolver.task_id) == (task.role, task.index) == ("worker", 1)
    assert resolver.cluster_spec().as_dict() == layout.cluster()
    assert resolver.num_accelerators() == {"GPU": 1}
    assert environ["CUDA_VISIBLE_DEVICES"] == ",".join(task.gpus)
    assert "TF_CONFIG" not in environ
    assert resolver.master("ps", 0) == f"grpc://{layout.cluster()['ps'][0]}"


def test_the_cluster_resolver_follows_the_tf_config_its_wrapper_gave_this_step() -> None:
    """Under with-tfconfig (its TF_CONFIG made for this very step, with a ps a node), the
    resolver asked for all-reduce agrees with the wrapper, which watches the ps, and leaves
    TF_CONFIG where TensorFlow's own code reads it."""
    environ = captured("block_3x3_gres2", "task-4")
    layout = lay_out_step(read_slurm_step(environ), LayoutPolicy())
    given = render.task_environment(layout, 4)
    environ |= given
    resolver = tfconfig_slurm.cluster_resolver(environ, all_reduce=True)
    task = layout.task(4)
    assert (resolver.task_type, resolver.task_id) == (task.role, task.index)
    assert resolver.cluster_spec().as_dict() == json.loads(given["TF_CONFIG"])["cluster"]
    assert "ps" in resolver.cluster_spec().as_dict()
    assert environ["TF_CONFIG"] == given["TF_CONFIG"]


# A process of a captured step (rank 4, given a GPU) that lists its devices, then makes the
# resolver: too late to set its GPUs.
LATE = """
import tensorflow as tf
import tfconfig_slurm
tf.config.list_physical_devices()
try:
    tfconfig_slurm.cluster_resolver()
except tfconfig_slurm.TfconfigSlurmError as error:
    print(error.one_line())
"""


def test_the_cluster_resolver_made_after_tensorflow_listed_its_devices_says_so() -> None:
    environ = captured("block_3x3_gres2", "task-4")
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    late = subprocess.run(
        [sys.executable, "-c", LATE],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPOSITORY), **environ},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert late.returncode == 0, late.stderr[-3000:]
    said = (
        r"cluster_resolver\(\): sets this task's GPUs \(CUDA_VISIBLE_DEVICES='\d', was unset\) "
        "after TensorFlow listed its devices"
    )
    assert re.match(said, late.stdout), late.stdout + late.stderr[-2000:]
    assert "HINT: make the resolver before any TensorFlow call" in late.stdout


def test_the_cluster_resolver_refuses_a_port_another_process_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked as the resolver first lays the task out in this process (the tests above made
    this task's resolver already)."""
    from tfconfig_slurm.backends.keras import resolver  # noqa: PLC0415

    monkeypatch.setattr(resolver, "_PORTS_CHECKED", set())
    environ = captured("block_3x3_gres2", "task-4")
    laid_out = lay_out_step(read_slurm_step(environ), LayoutPolicy())
    port = int(laid_out.task(4).address.rpartition(":")[2])
    with socket.create_server(("0.0.0.0", port)), pytest.raises(UsageError) as raised:
        tfconfig_slurm.cluster_resolver(environ)
    assert raised.value.culprit == "--port_base"
    assert f"port {port}, which another process on this node already uses" in raised.value.problem


@pytest.mark.parametrize(
    ("setting", "problem"),
    [
        ({"parameter_servers": 2}, "is no layout setting"),
        ({"ps_per_node": "two"}, "is 'two', expected a whole number"),
        ({"ps_per_node": True}, "is True, expected a whole number"),
        ({"all_reduce": "yes"}, "is 'yes', expected True or False"),
        ({"roles": "chief"}, "is 'chief', expected a tuple of roles"),
        ({"address_template": 5}, "is 5, expected a string"),
        ({"ps_per_node": -1}, "is -1, expected 0 or more"),
        ({"port_base": 70000}, "is 70000, expected a port from"),
    ],
)
def test_the_cluster_resolver_names_a_bad_argument_as_given(
    setting: dict[str, object], problem: str
) -> None:
    """Named as the script wrote it, not as the flag or the variable of the same setting."""
    with pytest.raises(UsageError) as raised:
        tfconfig_slurm.cluster_resolver(captured("block_3x3_gres2", "task-4"), **setting)
    (name,) = setting
    assert raised.value.culprit == f"cluster_resolver({name}=...)"
    assert raised.value.problem.startswith(problem)


def test_outside_a_step_the_cluster_resolver_is_this_process_alone_but_for_a_coordinator() -> None:
    import tensorflow as tf  # noqa: PLC0415

    alone = tfconfig_slurm.cluster_resolver({}, all_reduce=True)
    assert alone.cluster_spec().as_dict() == {}
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=alone)
    assert strategy.num_replicas_in_sync == 1
    with pytest.raises(UsageError) as raised:
        tfconfig_slurm.cluster_resolver({"SLURM_JOB_ID": "7"}, coordinator=True)
    assert raised.value.culprit == "cluster_resolver(coordinator=True)"


@pytest.mark.slurm
def test_a_crashed_all_reduce_worker_ends_the_step_by_name(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Alone, the chief could wait in its all-reduce for the dead worker; its wrapper, told by
    the worker's that the command failed, ends it (exit 3), unless the chief's all-reduce
    failed by itself first on the connection the worker's death reset (seen once in CI)."""
    step = slurm_cluster.run(
        ["srun", *TWO_NODES, "--label", str(WITH_TFCONFIG), "--all_reduce", "python", str(MWMS),
         str(tmp_path), "100000", "20"],
        timeout=180,
    )  # fmt: skip
    assert step.returncode != 0
    assert "worker 0: its command failed" in step.stderr, step.stderr[-3000:]
    by_name = re.search(r"worker 0 at node\d:\d+ says its command failed", step.stderr)
    ended = by_name and "ending this task (exit 3)" in step.stderr
    # Else the chief's all-reduce failed of the reset connection, named by its own exception.
    own = re.search(r"chief 0: its command failed: [\w.]+(Error|Exception)\b", step.stderr)
    assert ended or own, step.stderr[-3000:]
    assert reports(tmp_path) == {}
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_stock_keras_script_s_crashed_worker_restarts_the_step_in_its_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The guide's fault-tolerant recipe (BackupAndRestore, epochs of 10 steps) under
    with-tfconfig --all_reduce, run by a batch script's one line: worker 0 killed -9 at its
    25th step, the step starts again in the same job, the script resumes from its last epoch
    and the job completes, the restart and its cause in state.json."""
    model_dir, out = tmp_path / "run", tmp_path / "out"
    (tmp_path / "job.sbatch").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --output=job.out\n"
        f"export MWMS_BACKUP={model_dir}/backup\n"
        f"tfconfig-slurm srun --model_dir={model_dir} -- {WITH_TFCONFIG} --all_reduce "
        f"--model_dir={model_dir} python {MWMS} {out} 60 25\n"
    )
    job_id = slurm_cluster.sbatch(tmp_path, "job.sbatch")
    try:
        ended = wait_for_end(slurm_cluster, job_id)
    finally:
        slurm_cluster.run(["scancel", job_id])
    output = (tmp_path / "job.out").read_text()
    assert (ended["JobState"], ended["Restarts"]) == ("COMPLETED", "0"), output[-3000:]
    assert_restarted_once(output, model_dir, job_id, "with no checkpoint in its model directory")
    # Backed up after its second epoch (step 20), the run trains the last 4 of its 6.
    assert {name: report["epochs"] for name, report in reports(out).items()} == {
        "chief-0": 4,
        "worker-0": 4,
    }, output[-3000:]


@pytest.mark.slurm
def test_a_multi_worker_mirrored_script_in_a_parameter_server_layout_ends_with_a_hint(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The default layout (a ps on each node; here one node, its ps and the chief):
    TensorFlow fails the parameter server's script, and the chief, which would hang, is ended
    naming it."""
    step = slurm_cluster.run(
        ["srun", "--nodes=1", "--ntasks-per-node=2", "--label", str(WITH_TFCONFIG), "python",
         str(MWMS), str(tmp_path), "40"],
        timeout=180,
    )  # fmt: skip
    assert step.returncode != 0
    hint = (
        "MultiWorkerMirroredStrategy fails beside a parameter server: run it under "
        "with-tfconfig --all_reduce"
    )
    assert hint in step.stderr, step.stderr[-3000:]
    assert re.search(r"ps 0 at node\d:", step.stderr), step.stderr[-3000:]
    assert reports(tmp_path) == {}
    assert slurm_cluster.left_behind() == {}


PSS = REPOSITORY / "tests" / "fixtures" / "pss_keras.py"
# The first node: ps 0 and the coordinator; the second: ps 1 and worker 0.
COORDINATED = ("--nodes=2", "--ntasks-per-node=2")


def pss_step(cluster: SlurmCluster, out: Path, *victim: str) -> subprocess.CompletedProcess[str]:
    """The tutorial's script under with-tfconfig --coordinator, 4 epochs of 10 steps."""
    return cluster.run(
        ["srun", *COORDINATED, "--label", str(WITH_TFCONFIG), "--coordinator", "python",
         str(PSS), str(out), "4", *victim],
        timeout=240,
    )  # fmt: skip


@pytest.mark.slurm
def test_a_parameter_server_strategy_script_survives_a_killed_worker_and_every_task_ends(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Worker 0's command is killed -9 after the first epoch: its wrapper starts it again on
    its port, the coordinator carries on and trains every step; its exit ends the others."""
    step = pss_step(slurm_cluster, tmp_path, "worker")
    assert step.returncode == 0, step.stderr[-3000:]
    assert (
        "worker 0: its command was killed by SIGKILL; starting it again on its port "
        "(restart 1 of at most 3)"
    ) in step.stderr
    trained = json.loads((tmp_path / "chief.json").read_text())
    # Scheduled functions run at least once: one the killed worker had begun may run twice.
    assert trained["resumed_at_epoch"] == 0 and trained["steps"] >= 40, trained
    assert "ps 1: the coordinator finished; ending its command" in step.stderr
    assert slurm_cluster.left_behind() == {}


@pytest.mark.slurm
def test_a_killed_parameter_server_ends_the_step_and_a_new_one_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    step = pss_step(slurm_cluster, tmp_path, "ps")
    assert step.returncode != 0
    assert "ps 0: its command was killed by SIGKILL (exit 137)" in step.stderr, step.stderr[-3000:]
    assert "run the step again to resume from the last checkpoint" in step.stderr
    said = f"ps 0 at {slurm_cluster.nodes[0]}:" in step.stderr
    named = said and "says its command failed" in step.stderr
    # Else the coordinator's own call to the dead ps failed first, named by its exception.
    own = re.search(r"chief 0: its command failed: [\w.]+(Error|Exception)\b", step.stderr)
    assert named or own, step.stderr[-3000:]
    assert not (tmp_path / "chief.json").exists()
    assert slurm_cluster.left_behind() == {}
    again = pss_step(slurm_cluster, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    trained = json.loads((tmp_path / "chief.json").read_text())
    assert trained["resumed_at_epoch"] >= 1 and trained["steps"] == 40, trained


def test_without_tensorflow_the_layout_tools_work_and_the_runtime_says_what_to_install(
    tmp_path: Path,
) -> None:
    """`pip install .` on this Python (3.12 in make test), no extra: no TensorFlow at all."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=120)
    installed = subprocess.run(
        [bare / "bin" / "pip", "install", "-q", str(REPOSITORY)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    planned = subprocess.run(
        [bare / "bin" / "tfconfig-slurm", "--explain", "--all_reduce", "--nodelist=gpu[01-02]",
         "--gpus_per_node=4"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith("2 nodes, 8 tasks (block): 1 chief, 7 workers;")
    ran = subprocess.run(
        [bare / "bin" / "tfconfig-slurm-run", "--experiment=mnist_deep"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 2
    assert ran.stderr.startswith(
        "tfconfig-slurm-run: --experiment=mnist_deep (Estimator): needs TensorFlow 2.15, which "
        "this Python"
    ), ran.stderr
    assert not (tmp_path / "tf-output").exists()

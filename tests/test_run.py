"""`python -m tfconfig_slurm.run`: real TensorFlow training of mnist_deep in one process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.cli import REPOSITORY, run_module, tensorboard
from tests.slurm_cluster import SlurmCluster, unavailable
from tests.slurm_envs import captured
from tfconfig_slurm.process.records import history

RUN = "tfconfig_slurm.run"


def train(output_root: Path, *flags: str, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_module(
        RUN,
        "--experiment=mnist_deep",
        f"--output_root={output_root}",
        "--log_every_steps=5",
        *flags,
        environ=environ,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One short training run, shared by the tests that read what it left."""
    root = tmp_path_factory.mktemp("runs")
    # --ps_per_node as a --flagfile shared with a job's steps gives it: said, not refused.
    result = train(
        root,
        "--train_steps=20",
        "--save_checkpoints_steps=10",
        "--experiment_id=first",
        "--ps_per_node=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "first", result.stderr


@pytest.mark.tensorflow
def test_a_layout_flag_in_one_process_is_said_to_change_nothing(trained: tuple[Path, str]) -> None:
    _, log = trained
    assert (
        "--ps_per_node: lay out the tasks of a SLURM step, and this trains in one process, so "
        "they change nothing here"
    ) in log


@pytest.mark.tensorflow
def test_trains_evaluates_and_reports(trained: tuple[Path, str]) -> None:
    model_dir, log = trained
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["global_step"] == 20
    assert summary["eval"]["global_step"] == 20
    # Better than chance (0.1) after 20 steps (0.89 here): it trained on what it evaluates.
    assert summary["eval"]["accuracy"] > 0.5, summary["eval"]
    assert summary["trainers"][0]["examples_per_sec"] > 0
    assert (model_dir / "model.ckpt-20.index").is_file()
    [export] = (model_dir / "export" / "mnist_deep").iterdir()
    assert f"exported the model to {export}" in log
    assert "starting at step 0" in log
    assert "handwritten digits that ship with tfconfig-slurm" in log
    # The loss beside the speed, in every trainer's log (Estimator's own lines are silenced).
    assert re.search(r"step \d+: loss \d[\d.e+-]*, [\d.]+ examples/s, [\d.]+ global steps/s", log)
    # Each checkpoint timed, for the stop before a time limit (test_time_limit.py).
    written = re.findall(r"checkpoint of step (\d+) written in \d+\.\d\d s", log)
    assert written == ["0", "10", "20"], log[-3000:]


@pytest.mark.tensorflow
def test_event_files_hold_loss_accuracy_and_throughput(trained: tuple[Path, str]) -> None:
    import tensorflow as tf  # noqa: PLC0415

    model_dir, _ = trained
    tags: set[str] = set()
    for events in model_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            tags.update(value.tag for value in event.summary.value)
    assert {"loss", "accuracy", "examples_per_sec", "global_steps_per_sec"} <= tags
    eval_tags: set[str] = set()
    for events in (model_dir / "eval").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            eval_tags.update(value.tag for value in event.summary.value)
    assert {"loss", "accuracy"} <= eval_tags


@pytest.mark.tensorflow
def test_launch_tensorboard_serves_the_output_root(trained: tuple[Path, str]) -> None:
    model_dir, _ = trained
    with (
        tensorboard(model_dir.parent) as url,
        urllib.request.urlopen(f"{url}data/plugin/scalars/tags", timeout=60) as response,
    ):
        tags = json.load(response)
    assert {"loss", "accuracy", "examples_per_sec"} <= set(tags["first"])


@pytest.mark.parametrize("port", ["abc", "-1", "99999", "18446744073709551617"])
def test_launch_tensorboard_refuses_a_port_that_is_none(tmp_path: Path, port: str) -> None:
    refused = subprocess.run(
        [str(REPOSITORY / "launch" / "tensorboard"), str(tmp_path)],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable,
             "TENSORBOARD_PORT": port},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"tensorboard: TENSORBOARD_PORT: '{port}' is not a port")
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize(
    ("argument", "variable", "named"),
    [("missing", "", "OUTPUT_ROOT"), ("", "missing", "TFCONFIG_SLURM_OUTPUT")],
)
def test_launch_tensorboard_names_what_chose_a_root_that_is_none(
    tmp_path: Path, argument: str, variable: str, named: str
) -> None:
    refused = subprocess.run(
        [str(REPOSITORY / "launch" / "tensorboard"), *filter(None, [argument])],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable,
             "TFCONFIG_SLURM_OUTPUT": variable},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"tensorboard: {named}: 'missing' is not a directory")
    assert refused.stderr.count("\n") == 1


def test_launch_tensorboard_refuses_a_program_that_is_no_python_with_tensorboard(
    tmp_path: Path,
) -> None:
    """`true` exits 0 for any arguments, as an import that worked would."""
    refused = subprocess.run(
        [str(REPOSITORY / "launch" / "tensorboard"), str(tmp_path)],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": "true"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(
        "tensorboard: TFCONFIG_SLURM_PYTHON: 'true' has no tensorboard"
    )


def test_launch_tensorboard_says_its_help_and_serves_the_network_when_asked(
    tmp_path: Path,
) -> None:
    script = str(REPOSITORY / "launch" / "tensorboard")
    environ = {"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable}
    helped = subprocess.run(
        [script, "--help"], env=environ, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("Serve TensorBoard on an output root")
    assert "launch/tensorboard [OUTPUT_ROOT] [tensorboard flags]" in helped.stdout
    # --bind_all replaces the script's own --host localhost, which TensorBoard refused beside it.
    server = subprocess.Popen(
        [script, str(tmp_path), "--bind_all"], env={**environ, "TENSORBOARD_PORT": "0"},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        said = server.stderr.readline()
        assert "to the network as its flags say" in said, said
        lines = iter(server.stderr.readline, "")
        served = next((line for line in lines if "http://" in line), "")
        assert served.startswith("TensorBoard ") and server.poll() is None, served
    finally:
        server.terminate()
        server.wait(timeout=30)


def batch_script(script: str, cwd: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPOSITORY / "launch" / script), "--train_steps=10"],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable, **environ},
        cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("script", ["train.sbatch", "train-hetjob.sbatch"])
def test_the_batch_script_run_outside_a_job_says_to_submit_it(tmp_path: Path, script: str) -> None:
    refused = batch_script(script, tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"{script}: SLURM_JOB_ID: not set"), refused.stderr
    assert refused.stderr.count("\n") == 1 and "HINT: submit it: sbatch" in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_batch_script_run_in_salloc_s_shell_says_to_submit_it(tmp_path: Path) -> None:
    """salloc's shell has a job id, but not the batch shell's node variables: the script
    stopped half-way there, with a bash error, and left its run folder."""
    salloc = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node3", "SLURM_SUBMIT_DIR": str(tmp_path)}
    refused = batch_script("train.sbatch", tmp_path, **salloc)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("train.sbatch: SLURM_CPUS_ON_NODE: not set"), refused.stderr
    assert refused.stderr.count("\n") == 1 and "HINT: submit it: sbatch" in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_heterogeneous_script_submitted_elsewhere_says_where_to_submit_it(
    tmp_path: Path,
) -> None:
    """sbatch runs a copy of the script, which finds train.sbatch from the submit directory."""
    refused = batch_script("train-hetjob.sbatch", tmp_path, SLURM_JOB_ID="7",
                           SLURM_SUBMIT_DIR=str(tmp_path))  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(
        f"train-hetjob.sbatch: TFCONFIG_SLURM_LAUNCH: '{tmp_path}/launch' has no train.sbatch."
    ), refused.stderr
    assert refused.stderr.count("\n") == 1 and "HINT: submit from the repository" in refused.stderr


# The interpreter this test environment was made from: a Python without tfconfig_slurm.
BARE_PYTHON = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}")


@pytest.mark.parametrize(
    ("script", "python", "said"),
    [
        ("with-tfconfig", BARE_PYTHON, f"TFCONFIG_SLURM_PYTHON: '{BARE_PYTHON}' is no Python"),
        ("sweep", BARE_PYTHON, f"TFCONFIG_SLURM_PYTHON: '{BARE_PYTHON}' is no Python"),
        ("with-tfconfig", "no-such-python", "TFCONFIG_SLURM_PYTHON: 'no-such-python' is not a"),
        ("train.sbatch", BARE_PYTHON, f"TFCONFIG_SLURM_PYTHON: '{BARE_PYTHON}' is no Python"),
        # A program that exits 0 for any arguments, as an import that worked would.
        ("with-tfconfig", "true", "TFCONFIG_SLURM_PYTHON: 'true' is no Python that imports"),
        ("train.sbatch", "true", "TFCONFIG_SLURM_PYTHON: 'true' is no Python that imports"),
    ],
)
def test_a_launch_script_without_the_package_says_which_python_in_one_line(
    tmp_path: Path, script: str, python: str, said: str
) -> None:
    refused = subprocess.run(
        [str(REPOSITORY / "launch" / script), "--train_steps=10"],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": python,
             # As a batch job would have them.
             "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_CPUS_ON_NODE": "2",
             "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NAME": "train"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"{script}: {said}"), refused.stderr
    assert refused.stderr.count("\n") == 1 and "HINT: activate the environment" in refused.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.tensorflow
def test_resumes_from_the_latest_checkpoint(trained: tuple[Path, str], tmp_path: Path) -> None:
    # A copy: the shared run stays at step 20 for the tests that read it, in any order.
    model_dir = shutil.copytree(trained[0], tmp_path / "first")
    result = train(tmp_path, "--train_steps=30", "--experiment_id=first")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 20" in result.stderr
    assert "nothing to train" not in result.stderr
    assert json.loads((model_dir / "summary.json").read_text())["global_step"] == 30
    assert (model_dir / "model.ckpt-30.index").is_file()


@pytest.mark.tensorflow
def test_a_run_already_at_its_steps_says_there_is_nothing_to_train(
    trained: tuple[Path, str], tmp_path: Path
) -> None:
    model_dir = shutil.copytree(trained[0], tmp_path / "first")
    trained_summary = json.loads((model_dir / "summary.json").read_text())
    before = json.loads((model_dir / "state.json").read_text())["hparams"]
    # Other hparams, with nothing to train: the run keeps those it was trained with.
    result = train(tmp_path, "--train_steps=20", "--experiment_id=first", "--hparams=dropout=0.1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((model_dir / "state.json").read_text())["hparams"] == before
    assert (
        "is trained already, so it is evaluated with the hparams it was trained with; "
        "dropout=0.1 would apply only to steps trained"
    ) in result.stderr
    assert re.search(
        r"the checkpoint in \S+ is at global step 20, and training ends at step 20: nothing to "
        "train; the checkpoint is evaluated and reported. HINT: raise --train_steps to train on",
        result.stderr,
    ), result.stderr[-3000:]
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["eval"]["global_step"] == 20
    # Evaluated again, and the training's figures kept: the runs table still shows its speed.
    assert re.search(r"done at step 20 \(evaluated again in [\d.]+ s\): ", result.stderr)
    assert summary["wall_time_s"] == trained_summary["wall_time_s"]
    assert summary["trainers"] == trained_summary["trainers"]
    assert summary["trainers"][0]["examples_per_sec"] > 0


BAD_EXPERIMENT = "import tensorflow as tf\n\ndef input_fn(mode, params):\n    return None\n"


@pytest.mark.parametrize(
    ("flags", "culprit", "module"),
    [
        (("--experiment=no_such_experiment",), "--experiment", None),
        (("--experiment=mnist_dep",), "HINT: did you mean mnist_deep?", None),
        (("--experiment=missing/file.py",), "--experiment", None),
        # Its module imports TensorFlow.
        pytest.param(
            ("--experiment={module}",),
            "defines no model_fn",
            BAD_EXPERIMENT,
            marks=pytest.mark.tensorflow,
        ),
        (
            ("--experiment={module}",),
            "input_fn(params) cannot be called as input_fn(mode, params)",
            "def model_fn(features, labels, mode, params): pass\ndef input_fn(params): pass\n",
        ),
        (
            ("--experiment={module}",),
            "model_fn(features, labels, mode) cannot be called as "
            "model_fn(features, labels, mode, params): it takes no params",
            "def model_fn(features, labels, mode): pass\ndef input_fn(mode, params): pass\n",
        ),
        (
            ("--experiment={module}",),
            "train_input_fn(params, batch_size) cannot be called as train_input_fn(params)",
            "def model_fn(features, labels, mode, params): pass\n"
            "def train_input_fn(params, batch_size): pass\n"
            "def eval_input_fn(params): pass\n",
        ),
        (("--experiment={module}",), "my_experiment.py:1: NameError", "undefined_name\n"),
        # The module's line, not the import machinery's (<frozen importlib._bootstrap>).
        (("--experiment={module}",), "my_experiment.py:2: SyntaxError", "x = 1\ndef model_fn(:\n"),
        (("--experiment={module}",), "no_such_package", "import no_such_package\n"),
        (("--experiment=mnist_deep", "--batch_size=0"), "--batch_size", None),
        (("--experiment=mnist_deep", "--local_cluster=ps=0,workers=2"), "--local_cluster", None),
        (("--experiment=mnist_deep", "--local_cluster=gpus=2"), "--local_cluster", None),
        (("--experiment=mnist_deep", "--gpu_memory_fraction=1.5"), "--gpu_memory_fraction", None),
        (
            ("--experiment=mnist_deep", "--flagfile=/no/such/flags"),
            "--flagfile: cannot be read: No such file or directory: '/no/such/flags'",
            None,
        ),
        (("--experiment=mnist_deep", "--hparams=learning_rate"), "--hparams", None),
        (("--experiment=mnist_deep", "--hparams=momentum=0.9"), "--hparams", None),
        (("--experiment=mnist_deep", "--hparams=learning_rate=fast"), "--hparams", None),
        (
            ("--experiment=mnist_deep", "--hparams=learning_rate=nan"),
            "--hparams: sets learning_rate='nan', expected a finite float like its default",
            None,
        ),
        (
            ("--experiment=mnist_deep", "--hparams=learning_rate=0.1,learning_rate=0.2"),
            "--hparams: sets learning_rate twice",
            None,
        ),
        (
            ("--experiment={module}", "--hparams=layers=3"),
            "--hparams: sets layers, whose default [1, 2] is a list: the command line sets only "
            "bool, int, float and str hparams",
            "HPARAMS = {'layers': [1, 2]}\n"
            "def model_fn(features, labels, mode, params): pass\n"
            "def input_fn(mode, params): pass\n",
        ),
        (("--experiment=mnist_deep", "--hparams=shuffle_buffer=1" + "0" * 400), "--hparams", None),
        # The experiment's own check_hparams, before anything is written.
        # mnist_deep's check_hparams, which an import of it (and of TensorFlow) reads.
        pytest.param(
            ("--experiment=mnist_deep", "--hparams=dropout=1.5"),
            "--hparams: sets dropout=1.5, expected from 0 to below 1",
            None,
            marks=pytest.mark.tensorflow,
        ),
        (
            ("--experiment={module}", "--hparams=layers=0"),
            "--hparams: layers=0 is too few. HINT: the experiment's check_hparams refused it; "
            "its defaults: layers=2",
            "HPARAMS = {'layers': 2}\n"
            "def check_hparams(hparams):\n"
            "    if hparams['layers'] < 1:\n"
            "        raise ValueError(f'layers={hparams[\"layers\"]} is too few')\n"
            "def model_fn(features, labels, mode, params): pass\n"
            "def input_fn(mode, params): pass\n",
        ),
        (
            ("--experiment={module}",),
            "my_experiment.check_data is an int, not a function",
            "check_data = 3\n"
            "def model_fn(features, labels, mode, params): pass\n"
            "def input_fn(mode, params): pass\n",
        ),
        (("--train_steps=10",), "--experiment", None),
        (
            ("--experiment=mnist_deep", "--model_dir=/tmp/x"),
            "--model_dir: is not a flag of tfconfig-slurm-run; runs go where --output_root "
            "says, each in its model directory <output_root>/<experiment_id>",
            None,
        ),
        (("stray", "--experiment=mnist_deep"), "'stray'", None),
        (("--experiment=mnist_deep", "--sync_replicas"), "--sync_replicas", None),
        (
            ("--experiment=mnist_deep", "--train_steps=0"),
            "--train_steps: is '0', expected a positive integer",
            None,
        ),
        (
            ("--experiment=mnist_deep", f"--train_steps={2**63}"),
            "--train_steps: is 9223372036854775808, past the largest global step, 2**63 - 1",
            None,
        ),
        (
            ("--experiment=mnist_deep", "--train_steps=abc"),
            "--train_steps: is 'abc', expected a whole number. HINT: tfconfig-slurm-run --help "
            "says what --train_steps takes",
            None,
        ),
        (
            ("--experiment=mnist_deep", "--sync_replicas=maybe"),
            "--sync_replicas: is 'maybe', expected true or false",
            None,
        ),
        (("--experiment=mnist_deep", "--preempt_signal=KILL"), "--preempt_signal", None),
        # train.sbatch reads these answers: once the help's text named the run's directory.
        *(
            (
                (f"--print_{answer}", "--help"),
                f"--help: comes with --print_{answer}, whose answer a batch script reads: the "
                "help's text would be read as the answer",
                None,
            )
            for answer in ("model_dir", "max_restarts")
        ),
        (
            ("--experiment=mnist_deep", "--print_model_dir", "--print_max_restarts"),
            "--print_max_restarts: comes with --print_model_dir: a batch script reads one answer",
            None,
        ),
        (
            ("--experiment=mnist_deep", "--steps_per_execution=4"),
            "--steps_per_execution: applies to a Keras 3 experiment only. HINT: leave it out; a "
            "tf-keras experiment can pass steps_per_execution to its own model.compile",
            None,
        ),
        (("--experiment=mnist_deep", "--steps_per_execution=0"), "--steps_per_execution", None),
        (("--experiment=mnist_deep", "--max_requeues=-1"), "--max_requeues", None),
        (("--experiment=mnist_deep", "--data_dir=/no/such/dir"), "--data_dir", None),
        # An empty value is no value left out: a variable unset in a batch script.
        *(
            (
                ("--experiment=mnist_deep", f"--{name}="),
                f"--{name}: is '': empty, as from a variable that is unset. HINT: "
                f"tfconfig-slurm-run --help says what --{name} takes",
                None,
            )
            for name in ("data_dir", "output_root")
        ),
        # A directory without the MNIST files: the experiment's check_data says so.
        pytest.param(
            ("--experiment=mnist_deep", "--data_dir=/etc"),
            "--data_dir: is /etc, which lacks train-images-idx3-ubyte, ",
            None,
            marks=pytest.mark.tensorflow,
        ),
        (
            ("--experiment=mnist_deep", "--experiment_id=../x"),
            "--experiment_id: is '../x', not the name of a folder",
            None,
        ),
        (("--experiment=mnist_deep", "--experiment_id=grp/r1"), "--experiment_id: is 'grp", None),
        (("--experiment=mnist_deep", "--experiment_id="), "--experiment_id: is ''", None),
        (("--experiment=mnist_deep", "--experiment_id=a\nb"), "--experiment_id: is 'a\\nb'", None),
        (("--experiment=mnist_deep", "--experiment_id= "), "--experiment_id: is ' '", None),
        (
            ("--experiment=mnist_deep", "--experiment_id=" + "a" * 256),
            "--experiment_id: names a folder of 256 bytes, longer than the 255",
            None,
        ),
        (("--experiment=/etc/hostname",), "is not a .py file", None),
        # A file of the working directory, named without a folder: not a module path.
        (("--experiment=README.md",), "file 'README.md' is not a .py file", None),
        (("--experiment=/etc",), "'/etc' is a directory", None),
        (("--experiment=mnist_deep.py",), "ships with tfconfig-slurm: --experiment=", None),
        (
            ("--experiment=mnist_keras",),
            "--experiment=mnist_keras (Keras): needs TensorFlow 2.16 or later with tf-keras, "
            "and this Python 3.",
            None,
        ),
        (
            ("--experiment=mnist_deep", "--save_checkpoints_steps=5", "--save_checkpoints_secs=5"),
            "--save_checkpoints_steps",
            None,
        ),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(
    tmp_path: Path, flags: tuple[str, ...], culprit: str, module: str | None
) -> None:
    path = tmp_path / "my_experiment.py"
    if module is not None:
        path.write_text(module)
    output_root = tmp_path / "out"
    result = run_module(
        RUN, f"--output_root={output_root}", *(flag.format(module=path) for flag in flags)
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert result.stderr.startswith("tfconfig-slurm-run: ")
    assert culprit in result.stderr
    assert "HINT: " in result.stderr
    assert not any(output_root.glob("*/*"))


def test_unwritable_output_root_creates_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = train(blocker / "runs")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--output_root" in result.stderr and "is a file" in result.stderr
    assert blocker.read_text() == "not a directory\n"


@pytest.mark.parametrize(
    ("flags", "environ", "culprit"),
    [
        # The run's own name taken by a file: another name is the fix.
        (("--experiment_id=taken",), {}, "--experiment_id: names {root}/taken, a file"),
        # The root chosen by the variable, not the flag: the message names the variable.
        ((), {"TFCONFIG_SLURM_OUTPUT": "{root}/taken"}, "TFCONFIG_SLURM_OUTPUT: cannot hold"),
        # The kernel's view, which root may write to but which holds no files.
        (
            (),
            {"TFCONFIG_SLURM_OUTPUT": "/proc/tfconfig-slurm"},
            "TFCONFIG_SLURM_OUTPUT: cannot hold /proc/tfconfig-slurm/mnist_deep: /proc is on a "
            "filesystem of no size",
        ),
    ],
)
def test_print_model_dir_refuses_a_model_directory_that_cannot_be(
    tmp_path: Path, flags: tuple[str, ...], environ: dict[str, str], culprit: str
) -> None:
    """A batch script names the model directory first: its job stops there, not at mkdir."""
    (tmp_path / "taken").write_text("a file\n")
    environ = {name: value.format(root=tmp_path) for name, value in environ.items()}
    result = run_module(
        RUN,
        "--experiment=mnist_deep",
        *([f"--output_root={tmp_path}"] if not environ else []),
        "--print_model_dir",
        *flags,
        environ=environ,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"tfconfig-slurm-run: {culprit.format(root=tmp_path)}")
    assert [path.name for path in tmp_path.iterdir()] == ["taken"]


def test_a_full_output_root_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("mounting a small file system to fill needs root")
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)], check=True)
    try:
        result = train(full)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1
        assert "--output_root" in result.stderr and "MiB free" in result.stderr
        assert list(full.iterdir()) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_planned_layout_does_not_train(tmp_path: Path) -> None:
    result = train(tmp_path, "--nodelist=n[1-2]", environ=captured("uneven_n10_cpu", "task-0"))
    assert result.returncode == 2
    assert result.stderr.startswith("tfconfig-slurm-run: --nodelist: ")
    assert not (tmp_path / "mnist_deep").exists()


@pytest.fixture
def node_names(slurm_cluster: SlurmCluster) -> None:
    """The captured steps' nodes (node1, ...) resolve, as a task's start checks, only while the
    test cluster has put them in /etc/hosts: these tests run beside it, in its lane."""


@pytest.mark.tensorflow
@pytest.mark.parametrize("flag", ["--ps_per_node=0", "--all_reduce"])
@pytest.mark.usefixtures("node_names")
def test_a_step_without_parameter_servers_is_refused(tmp_path: Path, flag: str) -> None:
    result = train(tmp_path, flag, environ=captured("uneven_n10_cpu", "task-0"))
    assert result.returncode == 2
    culprit = flag.partition("=")[0]
    assert result.stderr.startswith(
        f"tfconfig-slurm-run: {culprit}: gives a cluster without parameter servers, which "
        "Estimator training needs"
    ), result.stderr
    assert not (tmp_path / "mnist_deep").exists()


@pytest.mark.tensorflow
@pytest.mark.usefixtures("node_names")
def test_an_estimator_experiment_refuses_a_coordinator_s_layout_as_flag_and_as_tf_config(
    tmp_path: Path,
) -> None:
    """Only a Keras experiment trains with ParameterServerStrategy's coordinator: for an
    Estimator one, --coordinator and a TF_CONFIG made with it (python -m tfconfig_slurm.run
    under with-tfconfig --coordinator) say so in one line."""
    environ = captured("uneven_n10_cpu", "task-0")
    by_flag = train(tmp_path, "--coordinator", environ=environ)
    made = run_module("tfconfig_slurm.tfconfig", "--coordinator", environ=environ)
    assert made.returncode == 0, made.stderr
    by_tf_config = train(tmp_path, environ=environ | {"TF_CONFIG": made.stdout.strip()})
    for result, culprit in ((by_flag, "--coordinator"), (by_tf_config, "TF_CONFIG")):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(
            f"tfconfig-slurm-run: {culprit}: lays the step out for ParameterServerStrategy's "
            "coordinator, which only a Keras experiment trains with"
        ), result.stderr
        assert "with-tfconfig --coordinator" in result.stderr
    assert not (tmp_path / "mnist_deep").exists()


def test_a_sweep_s_run_is_its_own_though_experiment_id_is_exported(tmp_path: Path) -> None:
    """sbatch passes the submitting shell's environment on to every array task."""
    (tmp_path / "lr.txt").write_text("learning_rate=0.1\nlearning_rate=0.2\n")
    array_task = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "1"}
    result = train(
        tmp_path / "out",
        f"--sweep_file={tmp_path / 'lr.txt'}",
        "--print_model_dir",
        environ={**array_task, "EXPERIMENT_ID": "lr5e-4"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'out' / 'lr-1'}\n"


@pytest.mark.parametrize(
    ("flags", "environ", "expected"),
    [
        ((), {}, "mnist_deep"),
        (("--experiment_id=lr5e-4",), {}, "lr5e-4"),
        # A job array's tasks: each its own directory, by default.
        (
            (),
            {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "3"},
            "mnist_deep-3",
        ),
        # An inherited TF_CONFIG in a batch script has no say in where the run goes.
        ((), {"SLURM_JOB_ID": "12", "TF_CONFIG": "{not json"}, "mnist_deep"),
    ],
)
def test_print_model_dir_names_the_directory_and_creates_nothing(
    tmp_path: Path, flags: tuple[str, ...], environ: dict[str, str], expected: str
) -> None:
    result = train(tmp_path, "--print_model_dir", *flags, environ=environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / expected}\n"
    assert list(tmp_path.iterdir()) == []


def test_print_model_dir_says_which_run_it_would_carry_on(tmp_path: Path) -> None:
    """On stderr, for a batch script's .out: a new run, one resumed at its step (trained last
    by which job), or one trained already, with nothing to train (a newcomer's first job
    carried on `make run`'s 600 steps and said nothing)."""
    flags = ("--print_model_dir", "--experiment_id=lr", "--train_steps=400")
    fresh = train(tmp_path, *flags)
    assert fresh.stderr == f"{tmp_path}/lr: a new run, to step 400\n"
    run = tmp_path / "lr"
    run.mkdir()
    (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-600"\n')
    (run / "model.ckpt-600.index").write_bytes(history.TABLE_MAGIC)
    (run / "state.json").write_text('{"state": "done", "job_id": null, "updated": 1.8e9}')
    trained = train(tmp_path, *flags)
    assert trained.stderr.startswith(
        f"{tmp_path}/lr: the run is at step 600 already, and training ends at step 400: "
        "nothing to train, it is only evaluated (last trained outside SLURM at 2027-01-15 "
    ), trained.stderr
    assert "HINT: raise the steps to train on, or give another experiment id" in trained.stderr
    (run / "state.json").write_text('{"state": "stopped", "job_id": "41"}')
    resumed = train(tmp_path, *flags[:2], "--train_steps=1000")
    assert resumed.stderr == (
        f"{tmp_path}/lr: resumes the run at step 600, to step 1000 (last trained by job 41, "
        "stopped)\n"
    )
    assert resumed.stdout == f"{run}\n"
    # Another experiment's run: refused, before a job starts its step.
    (run / "state.json").write_text('{"state": "done", "experiment": "tiny"}')
    other = train(tmp_path, *flags)
    assert (other.returncode, other.stdout) == (2, ""), other.stderr
    assert other.stderr == (
        f"tfconfig-slurm-run: --experiment_id: names {run}, a run of 'tiny', not of "
        "'mnist_deep': it would resume another model's checkpoints and write over that run's "
        "record. HINT: give this run its own --experiment_id (or EXPERIMENT_ID)\n"
    )


def test_an_empty_output_root_variable_is_as_if_unset() -> None:
    """As launch/train.sbatch reads it: not the working directory itself."""
    result = run_module(
        RUN, "--experiment=mnist_deep", "--print_model_dir", environ={"TFCONFIG_SLURM_OUTPUT": ""}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "tf-output/mnist_deep\n"


@pytest.mark.parametrize(
    ("flag", "culprit"),
    [
        ("--local_cluster=foo=1", "--local_cluster: has 'foo=1'"),
        ("--roles=ps,foo", "--roles: has 'foo'"),
        ("--port_base=5", "--port_base: is 5"),
        ("--coordinator", "--coordinator: lays the step out"),
        # mnist_deep's HPARAMS are literal: read from its source, with no TensorFlow.
        ("--hparams=nosuch=1", "--hparams: sets 'nosuch', which the experiment's HPARAMS"),
        ("--hparams=dropout=abc", "--hparams: sets dropout='abc', expected a finite float"),
    ],
)
def test_print_model_dir_refuses_the_flags_every_task_would(
    tmp_path: Path, flag: str, culprit: str
) -> None:
    """The batch script's first call: the job stops there, not in every task of its step."""
    result = train(tmp_path, "--print_model_dir", flag)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"tfconfig-slurm-run: {culprit}"), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_print_model_dir_refuses_a_hang_timeout_variable_every_task_would(tmp_path: Path) -> None:
    result = train(tmp_path, "--print_model_dir", environ={"TFCONFIG_SLURM_HANG_TIMEOUT": "abc"})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("tfconfig-slurm-run: TFCONFIG_SLURM_HANG_TIMEOUT: is 'abc'")


@pytest.mark.tensorflow
@pytest.mark.usefixtures("node_names")
def test_a_tf_config_inherited_into_a_step_is_set_aside(tmp_path: Path) -> None:
    """Exported in the shell that ran sbatch, it reaches every task: the task takes its place
    from SLURM instead, and the error names the flag, not a variable nobody meant."""
    inherited = '{"cluster": {"chief": ["elsewhere:1"]}, "task": {"type": "chief", "index": 0}}'
    environ = captured("uneven_n10_cpu", "task-0") | {"TF_CONFIG": inherited}
    result = train(tmp_path, "--ps_per_node=0", environ=environ)
    assert result.returncode == 2
    assert "TF_CONFIG: set, but made elsewhere" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("tfconfig-slurm-run: --ps_per_node: ")


@pytest.mark.tensorflow
@pytest.mark.usefixtures("node_names")
def test_a_tf_config_made_for_the_step_is_taken(tmp_path: Path) -> None:
    environ = captured("uneven_n10_cpu", "task-0")
    made = run_module("tfconfig_slurm.tfconfig", "--ps_per_node=0", environ=environ)
    assert made.returncode == 0, made.stderr
    result = train(tmp_path, environ=environ | {"TF_CONFIG": made.stdout.strip()})
    assert result.returncode == 2
    assert "set, but made" not in result.stderr
    assert result.stderr.startswith("tfconfig-slurm-run: TF_CONFIG: gives a cluster without")


@pytest.mark.parametrize(
    ("tf_config", "problem"),
    [
        ("{not json", "is not JSON"),
        ("[]", "is not a JSON object"),
        ('"chief"', "is not a JSON object"),
        ('{"cluster": {"chief": "a:1"}, "task": {"type": "chief", "index": 0}}', "'a:1', not a"),
        ('{"cluster": {"chief": ["a:1"]}, "task": {"type": "boss", "index": 0}}', "boss"),
        ('{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 3}}', "lacks"),
        (
            '{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}, '
            '"tfconfig_slurm": 7}',
            "not an object",
        ),
    ],
)
def test_a_bad_tf_config_is_one_line(tmp_path: Path, tf_config: str, problem: str) -> None:
    result = train(tmp_path, environ={"TF_CONFIG": tf_config})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("tfconfig-slurm-run: TF_CONFIG: ")
    assert problem in result.stderr


THREAD_PROBE = """
import json, os
from pathlib import Path
import tensorflow as tf

HPARAMS = {}


def input_fn(mode, params):
    return tf.data.Dataset.from_tensors((tf.ones([400, 400]), tf.zeros([1]))).repeat()


def _cpu_seconds_by_thread():
    seconds = {}
    for task in Path("/proc/self/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        seconds[task.name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


class _Probe(tf.compat.v1.train.SessionRunHook):
    # From the second step to the end, each thread's share of the CPU time the process used.
    def after_run(self, run_context, run_values):
        if not hasattr(self, "_start"):
            self._start = _cpu_seconds_by_thread()

    def end(self, session):
        spent = {
            thread: seconds - self._start.get(thread, 0.0)
            for thread, seconds in _cpu_seconds_by_thread().items()
        }
        Path(os.environ["PROBE_FILE"]).write_text(json.dumps(sorted(spent.values())))


def model_fn(features, labels, mode, params):
    weights = tf.compat.v1.get_variable("weights", [400, 400])
    hidden = features
    for _ in range(6):
        hidden = tf.tanh(tf.matmul(hidden, weights))
    loss = tf.reduce_mean(hidden)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(1e-4).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=[_Probe()])
"""


@pytest.mark.tensorflow
@pytest.mark.parametrize(("threads", "held"), [(1, True), (2, False)])
def test_thread_flags_hold_a_single_process(tmp_path: Path, threads: int, held: bool) -> None:
    """TensorFlow 2 sizes a process's thread pools once, from its eager context; a Session's
    ConfigProto alone left a single process given 1 thread computing on 2."""
    experiment = tmp_path / "probe.py"
    experiment.write_text(THREAD_PROBE)
    probe = tmp_path / "threads.json"
    result = run_module(
        RUN,
        f"--experiment={experiment}",
        f"--output_root={tmp_path}",
        "--train_steps=150",
        "--eval_steps=1",
        f"--intra_op_threads={threads}",
        f"--inter_op_threads={threads}",
        environ={"PROBE_FILE": str(probe)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spent = json.loads(probe.read_text())
    assert sum(spent) > 1.0, spent  # enough work to tell one thread from two
    # The busiest threads' seconds and the sum, should it fail: the list is cut in the report.
    assert (spent[-1] / sum(spent) > 0.85) is held, (spent[-4:], sum(spent))

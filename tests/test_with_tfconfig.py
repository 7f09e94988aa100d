"""`launch/with-tfconfig`: exports the task's TF_CONFIG and GPUs, then execs the command."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import REPOSITORY, free_port_block, wait_until
from tests.slurm_envs import captured, task_env
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step
from tfconfig_slurm.cluster.render import tf_config_json
from tfconfig_slurm.commands.with_tfconfig import MAX_ENVIRONMENT_STRING
from tfconfig_slurm.errors import ExitStatus
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.supervision.watchdog import WAITING, answers

WRAPPER = str(REPOSITORY / "launch" / "with-tfconfig")
# Prints what the command saw: its TF_CONFIG, its GPUs and its own arguments.
SHOW = (
    "import json, os, sys; print(json.dumps([os.environ.get('TF_CONFIG'), "
    "os.environ.get('CUDA_VISIBLE_DEVICES'), sys.argv[1:]]))"
)


def wrap(*arguments: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The wrapper run once, as a task of the step `environ` gives; on free ports of its own
    unless `arguments` choose them, so that tests run side by side (pytest -n, make check)."""
    ports = (
        []
        if any(word.startswith("--port_base") for word in arguments)
        else [f"--port_base={free_port_block(8)}"]
    )
    return subprocess.run(
        [WRAPPER, *ports, *arguments],
        env={"PATH": os.environ["PATH"], "TFCONFIG_SLURM_PYTHON": sys.executable, **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_exports_and_passes_the_commands_own_flags() -> None:
    result = wrap(
        "--ps_per_node=1",
        sys.executable,
        "-c",
        SHOW,
        "--ps_per_node=7",
        environ=captured("block_3x3_gres2", "task-5"),
    )
    assert result.returncode == 0, result.stderr
    tf_config, gpus, arguments = json.loads(result.stdout)
    assert json.loads(tf_config)["task"] == {"type": "worker", "index": 2}
    assert gpus == "1"
    assert arguments == ["--ps_per_node=7"]
    assert "rank 5 on node2 is worker 2" in result.stderr


def test_an_inherited_tf_config_is_replaced_with_a_warning() -> None:
    """A TF_CONFIG exported in the submitting shell reaches every task through srun."""
    environ = captured("block_3x3_gres2", "task-5") | {"TF_CONFIG": '{"cluster": {}}'}
    result = wrap(sys.executable, "-c", SHOW, environ=environ)
    assert result.returncode == 0, result.stderr
    assert json.loads(json.loads(result.stdout)[0])["task"] == {"type": "worker", "index": 2}
    assert "TF_CONFIG: set, but made elsewhere" in result.stderr
    assert "unset TF_CONFIG before sbatch or srun" in result.stderr


def test_an_empty_model_dir_is_refused_not_taken_for_none(tmp_path: Path) -> None:
    """`--model_dir=$DIR` with $DIR unset: no records would be written, without a word."""
    marker = tmp_path / "ran"
    result = wrap(
        "--model_dir=", "touch", str(marker), environ=captured("block_3x3_gres2", "task-5")
    )
    assert result.returncode == 2
    assert result.stderr == (
        "with-tfconfig: --model_dir: is '': empty, as from a variable that is unset. HINT: "
        "with-tfconfig --help says what --model_dir takes\n"
    )
    assert not marker.exists()


def test_refuses_to_overwrite_a_different_tf_config_of_this_step(tmp_path: Path) -> None:
    environ = captured("block_3x3_gres2", "task-5")
    shown = wrap("--port_base=12000", sys.executable, "-c", SHOW, environ=environ)
    outer = json.loads(shown.stdout)
    marker = tmp_path / "ran"
    nested = environ | {
        "TF_CONFIG": outer[0],
        "CUDA_VISIBLE_DEVICES": outer[1],
        "TFCONFIG_SLURM_STEP_GPUS": "1.0:0,1",
    }
    result = wrap("touch", str(marker), environ=nested)
    assert result.returncode == 2
    assert result.stderr.startswith("with-tfconfig: TF_CONFIG: is already set for this job step")
    assert "--override" in result.stderr
    assert not marker.exists()

    overridden = wrap("--override", sys.executable, "-c", SHOW, environ=nested)
    assert json.loads(json.loads(overridden.stdout)[0])["task"] == {"type": "worker", "index": 2}


def test_commands_under_the_wrapper_read_the_same_task() -> None:
    """tfconfig-slurm and a nested with-tfconfig read the step as SLURM made it, although the
    wrapper narrowed CUDA_VISIBLE_DEVICES to the task's own GPU."""
    environ = captured("block_3x3_gres2", "task-5")
    base = f"--port_base={free_port_block(8)}"
    outer = wrap(base, sys.executable, "-m", "tfconfig_slurm.tfconfig", "--export", environ=environ)
    assert outer.returncode == 0, outer.stderr
    # Its flags the outer one's: a nested wrapper refuses a TF_CONFIG of other flags.
    nested = wrap(
        base, sys.executable, "-m", "tfconfig_slurm.commands.with_tfconfig", base,
        sys.executable, "-c", SHOW, environ=environ,
    )  # fmt: skip
    assert nested.returncode == 0, nested.stderr
    tf_config, gpus, _ = json.loads(nested.stdout)
    assert json.loads(tf_config)["task"] == {"type": "worker", "index": 2}
    assert gpus == "1"
    assert "export CUDA_VISIBLE_DEVICES=1\n" in outer.stdout
    assert "export TFCONFIG_SLURM_STEP_GPUS=1.0:0,1\n" in outer.stdout


def test_the_same_tf_config_already_set_is_no_overwrite() -> None:
    environ = captured("block_3x3_gres2", "task-5")
    base = f"--port_base={free_port_block(8)}"
    first = json.loads(wrap(base, sys.executable, "-c", SHOW, environ=environ).stdout)[0]
    again = wrap(base, sys.executable, "-c", SHOW, environ=environ | {"TF_CONFIG": first})
    assert again.returncode == 0, again.stderr
    # Kept as it was, byte for byte, and not taken for one inherited from elsewhere.
    assert json.loads(again.stdout)[0] == first
    assert "TF_CONFIG: set, but made" not in again.stderr


def test_linux_refuses_an_environment_string_past_the_limit() -> None:
    """The limit the wrapper guards against is the kernel's, not ours."""
    with pytest.raises(OSError) as raised:
        subprocess.run(["true"], env={"X": "x" * MAX_ENVIRONMENT_STRING}, check=False)
    assert raised.value.errno == errno.E2BIG


def _cpu_step_of(nodes: int) -> dict[str, str]:
    """The last rank of a step of 2 tasks on each of `nodes` nodes: a leaf of the tree of
    trainers, so that its wrapper waits for no child on the made-up nodes."""
    names = [f"node{number:05d}" for number in range(nodes)]
    return task_env(names, [2] * nodes, 2 * nodes - 1, nodelist=f"node[00000-{nodes - 1:05d}]")


# Chief and workers only: with parameter servers the wrapper would watch thousands of them
# on made-up nodes.
ALL_TRAINERS = ("--all_reduce",)


def _environment_string_size(environ: dict[str, str]) -> int:
    step = read_slurm_step(environ)
    layout = lay_out_step(step, LayoutPolicy(all_reduce=True))
    return len("TF_CONFIG=") + len(tf_config_json(layout, step.rank)) + 1


def test_the_size_check_sits_exactly_at_the_kernel_limit(tmp_path: Path) -> None:
    """The largest step that fits is run; the next size up is refused with exit 2."""
    # Bisected, as the size grows with the nodes and each layout of thousands of them counts.
    nodes, over = 3000, 5000
    assert _environment_string_size(_cpu_step_of(over)) > MAX_ENVIRONMENT_STRING
    while over - nodes > 1:
        middle = (nodes + over) // 2
        if _environment_string_size(_cpu_step_of(middle)) > MAX_ENVIRONMENT_STRING:
            over = middle
        else:
            nodes = middle
    fits, too_big = _cpu_step_of(nodes), _cpu_step_of(nodes + 1)
    assert MAX_ENVIRONMENT_STRING - 40 < _environment_string_size(fits) <= MAX_ENVIRONMENT_STRING
    show = "import os; print(len(os.environ['TF_CONFIG']))"
    ran = wrap(*ALL_TRAINERS, sys.executable, "-c", show, environ=fits)
    assert ran.returncode == 0, ran.stderr[-500:]
    refused = wrap(*ALL_TRAINERS, "true", environ=too_big)
    assert refused.returncode == 2
    assert "TF_CONFIG" in refused.stderr


def test_a_tf_config_too_large_for_exec_says_what_to_do(tmp_path: Path) -> None:
    nodes = [f"gpu{number:04d}" for number in range(1, 4097)]
    environ = task_env(
        nodes,
        [9] * 4096,
        1,
        gpus="0,1,2,3,4,5,6,7",
        nodelist="gpu[0001-4096]",
        tasks_per_node_text="9(x4096)",
    )
    marker = tmp_path / "ran"
    result = wrap("touch", str(marker), environ=environ)
    assert result.returncode == 2
    assert "TF_CONFIG" in result.stderr
    assert "36864 tasks" in result.stderr
    assert "inside the training process" in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    ("arguments", "culprit"),
    [((), "COMMAND"), (("no-such-program-here",), "'no-such-program-here'")],
)
def test_bad_command(arguments: tuple[str, ...], culprit: str) -> None:
    result = wrap(*arguments, environ=captured("block_3x3_gres2", "task-5"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"with-tfconfig: {culprit}")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--ps_per_nod=1", "--ps_per_nod (in --flagfile={}): is not a flag of with-tfconfig"),
        # A word that is no flag would have led the command: python python train.py.
        ("python", "'python' (in --flagfile={}): is not a flag. HINT: a flag file holds flags"),
    ],
)
def test_a_bad_line_in_its_flagfile_names_that_file_not_the_command_s(
    tmp_path: Path, line: str, said: str
) -> None:
    flagfile = tmp_path / "layout.flags"
    flagfile.write_text(f"--ps_per_node=1\n{line}\n")
    result = wrap(
        f"--flagfile={flagfile}", "python", "train.py", "--flagfile=theirs.flags",
        environ=captured("block_3x3_gres2", "task-5"),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith(f"with-tfconfig: {said.format(flagfile)}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_a_flag_and_its_value_as_two_words_leave_the_command_whole() -> None:
    """absl takes --ps_per_node 2; the command after it is the command line's own."""
    result = wrap(
        "--ps_per_node", "2", sys.executable, "-c", SHOW, "--its_own",
        environ=captured("block_3x3_gres2", "task-5"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tf_config, _, arguments = json.loads(result.stdout)
    assert len(json.loads(tf_config)["cluster"]["ps"]) == 6
    assert arguments == ["--its_own"]


def test_outside_a_job_step_the_hint_names_the_command_that_plans_one() -> None:
    result = wrap("true", environ={})
    assert result.returncode == 2
    assert result.stderr.startswith("with-tfconfig: SLURM_JOB_ID: not set"), result.stderr
    assert "tfconfig-slurm --explain --nodelist='gpu[01-04]'" in result.stderr
    # Flags that no step takes together are refused first, in or out of one.
    both = wrap("--all_reduce", "--coordinator", "true", environ={})
    assert both.returncode == 2
    assert both.stderr.startswith("with-tfconfig: --coordinator:"), both.stderr
    # --independent goes with --keras3 only (a new user's went unremarked without it).
    alone = wrap("--independent", "true", environ={})
    assert alone.returncode == 2
    assert alone.stderr.startswith("with-tfconfig: --independent: is given without --keras3")


TWO_SERVERS = "--ps_per_node=2"


def wrapped(
    port_base: int,
    tasks: int,
    rank: int,
    *command: str,
    layout: str = TWO_SERVERS,
    ignoring: tuple[signal.Signals, ...] = (),
) -> subprocess.Popen[str]:
    """Rank `rank` of a one-node step of `tasks` on loopback, its command under the wrapper
    (by default 2 ps: ranks 0 and 1), started `ignoring` these signals."""
    return subprocess.Popen(
        [WRAPPER, layout, f"--port_base={port_base}", *command],
        env={
            "PATH": os.environ["PATH"],
            "TFCONFIG_SLURM_PYTHON": sys.executable,
            **task_env(["localhost"], [tasks], rank),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # The test's own main thread starts it: a fork beside threads is not at stake.
        preexec_fn=lambda: [signal.signal(each, signal.SIG_IGN) for each in ignoring],  # noqa: PLW1509
    )


def wrap_step(
    port_base: int,
    tasks: int,
    seconds_of: dict[int, str],
    default: str,
    layout: str = TWO_SERVERS,
) -> list[subprocess.Popen[str]]:
    """Every task of the step, each running SERVER for its seconds."""
    return [
        wrapped(port_base, tasks, rank, *SERVER, seconds_of.get(rank, default), layout=layout)
        for rank in range(tasks)
    ]


# A command that listens on its task's port, as a TensorFlow server does.
LISTENS = """import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][task["index"]].rpartition(":")[2])
server = socket.create_server(("0.0.0.0", port))
"""
# A stand-in for a TensorFlow server: listens on its task's port for its seconds, then exits
# 0, or 1 for negative seconds.
SERVER = [
    sys.executable,
    "-c",
    LISTENS
    + """seconds = float(sys.argv[1])
end = time.monotonic() + abs(seconds)
while time.monotonic() < end:
    server.settimeout(max(0.01, end - time.monotonic()))
    try:
        server.accept()[0].close()
    except OSError:
        pass
sys.exit(seconds < 0)""",
]


def answer_of(address: str) -> bytes | None:
    """What a task's port answers first (b"" for a command's own server), None if nothing
    listens there."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0) as connection:
            connection.settimeout(0.5)
            return connection.recv(len(WAITING))
    except TimeoutError:
        return b""
    except OSError:
        return None


def ended(step: list[subprocess.Popen[str]], seconds: float) -> tuple[list[int | None], str]:
    """Each task's exit status (None: still running, then killed) and all their logs."""
    deadline = time.monotonic() + seconds
    for process in step:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    statuses = [process.poll() for process in step]
    for process in step:
        process.kill()
    return statuses, "".join(f"== {process.communicate()[1]}" for process in step)


def test_a_task_alone_in_its_step_whose_command_fails_exits_at_once() -> None:
    """No peer watches its port, so it does not stay to say FAILED there."""
    alone = wrapped(
        free_port_block(1), 1, 0, sys.executable, "-c", "raise SystemExit(3)", layout="--all_reduce"
    )
    [status], logs = ended([alone], 30)
    assert status == 3, logs
    assert "chief 0: its command failed; exiting" in logs, logs
    assert "saying so on its port" not in logs


def test_eighteen_trainers_finish_through_their_tree_and_the_servers_end_exit_0() -> None:
    """The chief (16 children) and worker 0 (1 child) wait for the trainers below them; the
    chief's FINISHED ends ps 0's command, and ps 0's FINISHED ps 1's."""
    statuses, logs = ended(wrap_step(free_port_block(20), 20, {0: "600", 1: "600"}, "3"), 60)
    assert statuses == [0] * 20, logs
    assert "ps 0: every trainer finished; ending its command" in logs
    assert "chief 0 said so" in logs and "ps 0 said so" in logs
    assert "chief 0: its command and the 17 trainers below it finished" in logs


def test_a_trainer_that_fails_after_the_others_finished_ends_every_task() -> None:
    """The last trainer (below worker 0 in the tree) fails: worker 0 and its ps take it for
    lost, and the step ends, non-zero, every task gone. Worker 0, whose port said WAITING,
    says FAILED on it at once (it could not bind its port twice: the chief waited 4 s)."""
    base = free_port_block(20)
    statuses, logs = ended(wrap_step(base, 20, {0: "600", 1: "600", 19: "-6"}, "3"), 60)
    assert statuses[19] == 1, logs
    assert None not in statuses and 3 in statuses and 0 not in statuses[:2], statuses
    assert f"worker 16 at localhost:{base + 19} says its command failed" in logs
    assert f"worker 0 at localhost:{base + 3} says its command failed" in logs


# SERVER, but told SIGTERM it takes sys.argv[3] seconds to stop (as a script that checkpoints
# then), writes <sys.argv[2]>/<task type>-<index> and exits 143.
SLOW_TO_STOP = [
    sys.executable,
    "-c",
    """import json, os, signal, sys, time
def stop(number, frame):
    time.sleep(float(sys.argv[3]))
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    open(os.path.join(sys.argv[2], f"{task['type']}-{task['index']}"), "w").close()
    sys.exit(128 + number)
signal.signal(signal.SIGTERM, stop)
"""
    + SERVER[2],
]


@pytest.mark.parametrize(("stop_seconds", "stopped"), [(6, True), (600, False)])
def test_a_step_told_to_stop_leaves_each_trainer_its_own_stop(
    tmp_path: Path, stop_seconds: int, stopped: bool
) -> None:
    """scancel's SIGTERM reaches every task: the parameter servers' commands end at once and
    their ports go quiet, which does not make the trainers' wrappers kill their commands,
    still stopping (6 s, longer than a peer takes to be lost); a stop that would never end is
    ended as for a lost peer after its grace of 20 s."""
    base = free_port_block(4)
    step = [wrapped(base, 4, rank, *SERVER, "600") for rank in (0, 1)]
    step += [
        wrapped(base, 4, rank, *SLOW_TO_STOP, "600", str(tmp_path), str(stop_seconds))
        for rank in (2, 3)
    ]
    try:
        # Every task's port answering; then three probe rounds, so that each watcher has seen its
        # peers (one never seen is waited for as one still starting, for 10 minutes).
        assert wait_until(lambda: all(answers(f"localhost:{base + at}") for at in range(4)), 30.0)
        time.sleep(3 * timing.PROBE_SECONDS)
        for process in step:
            process.terminate()
        for process in step[2:]:
            process.wait(timeout=60)
    finally:
        statuses, logs = ended(step, 0)
    assert "went quiet while this task stops; its command has 20 s to finish its stop" in logs
    if stopped:
        assert statuses[2:] == [128 + signal.SIGTERM] * 2, logs
        assert sorted(path.name for path in tmp_path.iterdir()) == ["chief-0", "worker-0"]
        assert "ending this task (exit" not in logs
    else:
        assert statuses[2:] == [ExitStatus.PEER_LOST] * 2, logs
        assert not any(tmp_path.iterdir())
        assert re.search(r"ps \d at localhost:\d+ has not answered for 2\d s", logs), logs


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_finished_trainer_s_wrapper_still_ends_on_sigterm(number: signal.Signals) -> None:
    """Once its command has exited there is nothing to pass a signal on to: scancel ends it,
    as do SIGINT and SIGHUP."""
    base = free_port_block(4)
    step = wrap_step(base, 4, {2: "1"}, "600")
    try:
        # Its command done, the wrapper answers WAITING for worker 0, below it in the tree.
        assert wait_until(lambda: answer_of(f"localhost:{base + 2}") == WAITING, 30.0)
        step[2].send_signal(number)
        assert step[2].wait(timeout=30) == -number
    finally:
        ended(step, 0)


def test_commands_that_never_listen_end_at_once_with_their_status() -> None:
    """Commands that print and exit (no server): nothing waits for a peer that never was."""
    base = free_port_block(4)
    step = [wrapped(base, 4, rank, sys.executable, "-c", "print('hi')") for rank in range(4)]
    statuses, logs = ended(step, 20)
    assert statuses == [0, 0, 0, 0], logs


def test_a_worker_that_finishes_long_before_the_chief_waits_for_it() -> None:
    """Worker 0 finishes first; the chief, its parent in the tree, sees it only once its own
    command has finished: the worker still says FINISHED then."""
    statuses, logs = ended(wrap_step(free_port_block(4), 4, {0: "600", 1: "600", 2: "8"}, "1"), 60)
    assert statuses == [0, 0, 0, 0], logs
    assert "chief 0: its command and the 1 trainers below it finished" in logs


def test_a_chief_done_before_its_ps_listens_says_so_until_the_ps_has_heard() -> None:
    """The chief's command ends at once (a script rerun with nothing left to train) while its
    ps's command is still starting (importing TensorFlow): the chief says FINISHED for a
    probe's while, so that the ps's supervisor hears it, rather than leave the ps to wait for
    it as a task still starting."""
    base = free_port_block(2)
    layout = "--ps_per_node=1"
    ps = wrapped(base, 2, 0, "sleep", "30", layout=layout)
    # The chief starts once the ps's supervisor runs: started together, a loaded machine may
    # start the ps's seconds after the chief has finished and gone (its FINISHED lasts 1.5 s).
    assert ps.stderr is not None
    started = ps.stderr.readline()
    statuses, logs = ended([ps, wrapped(base, 2, 1, "true", layout=layout)], 20)
    logs = started + logs
    assert statuses == [0, 0], logs
    assert "ps 0: every trainer finished; ending its command" in logs


def test_all_reduce_trainers_finishing_apart_all_exit_0() -> None:
    """No parameter servers: 18 trainers watch their tree neighbours; those that finish first
    answer until the chief, which finishes last, has seen every one."""
    seconds = {rank: str(2 + rank % 5) for rank in range(18)}
    step = wrap_step(free_port_block(18), 18, {**seconds, 0: "9"}, "3", "--all_reduce")
    statuses, logs = ended(step, 60)
    assert statuses == [0] * 18, logs
    assert "chief 0: its command and the 17 trainers below it finished" in logs


def test_an_all_reduce_trainer_that_fails_ends_every_task_by_name() -> None:
    """Worker 16 (rank 17, below worker 0 in the tree) fails while the others train: worker 0
    names it, and the loss travels up the tree and down to every trainer."""
    base = free_port_block(18)
    statuses, logs = ended(wrap_step(base, 18, {17: "-4"}, "600", "--all_reduce"), 60)
    assert statuses[17] == 1, logs
    assert statuses[:17] == [3] * 17, (statuses, logs)
    assert f"worker 16 at localhost:{base + 17} says its command failed" in logs


# SERVER, but failing after sys.argv[1] seconds: a ValueError raised in
# <sys.argv[2]>/keras/src/trainers/trainer.py, as Keras 3's fit raises it under
# MultiWorkerMirroredStrategy (its message runs on over many lines).
FAILS_IN_KERAS_3 = [
    sys.executable,
    "-c",
    LISTENS
    + """time.sleep(float(sys.argv[1]))
sys.path.insert(0, sys.argv[2])
from keras.src.trainers import trainer
trainer.fit()""",
]
KERAS_3_ENGINE = """def fit():
    message = "Attempt to convert a value (PerReplica:{\\n  0: <tf.Tensor>\\n}) to a Tensor."
    raise ValueError(message)
"""


def test_trainers_that_fail_of_one_cause_each_name_their_own_failure_and_keras_3(
    tmp_path: Path,
) -> None:
    """A Keras 3 script under --all_reduce fails in every trainer: worker 0 first, the chief
    0.5 s later. Each says its own exception's line (not the chief that worker 0 is lost, as
    a newcomer saw), and that Keras 3 is not what MultiWorkerMirroredStrategy trains."""
    trainers = tmp_path / "keras" / "src" / "trainers"
    trainers.mkdir(parents=True)
    for package in (trainers, trainers.parent, trainers.parent.parent):
        (package / "__init__.py").write_text("")
    (trainers / "trainer.py").write_text(KERAS_3_ENGINE)
    base = free_port_block(2)
    step = [
        wrapped(base, 2, rank, *FAILS_IN_KERAS_3, seconds, str(tmp_path), layout="--all_reduce")
        for rank, seconds in ((0, "3.5"), (1, "3"))
    ]
    statuses, logs = ended(step, 60)
    assert statuses == [1, 1], logs
    for task in ("chief 0", "worker 0"):
        assert (
            f"{task}: its command failed: ValueError: Attempt to convert a value (PerReplica:{{ "
            "0: <tf.Tensor> }) to a Tensor.; saying so"
        ) in logs, logs
        assert f"{task}: its command's traceback runs through Keras 3 (import keras)" in logs
    assert "as worker 0 is lost" not in logs
    # The command's own output passed through whole.
    assert logs.count("\n}) to a Tensor.\n") == 2, logs


def runs_table(root: Path) -> str:
    listed = subprocess.run(
        [sys.executable, "-m", "tfconfig_slurm.commands", "runs", str(root)],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return listed.stdout


def test_told_its_model_dir_the_step_records_the_first_to_fail_for_runs(tmp_path: Path) -> None:
    """Worker 0 (rank 3) fails while the others train: its wrapper records it in the run
    directory; `tfconfig-slurm runs` shows the run failed, and who failed first."""
    base, model_dir = free_port_block(4), tmp_path / "mine"
    step = [
        wrapped(base, 4, rank, f"--model_dir={model_dir}", *SERVER, "-2" if rank == 3 else "600")
        for rank in range(4)
    ]
    statuses, logs = ended(step, 60)
    assert statuses[3] == 1 and None not in statuses, (statuses, logs)
    # Each survivor that lost another ends for the run's failure, named, not for the other
    # survivor (ps 0 and ps 1 blamed each other).
    ends = re.findall(r"(\w+ \d): it ends, as ([^;]*);", logs)
    assert ends and set(ends) <= {
        (task, "the run failed (worker 0 first)") for task in ("ps 0", "ps 1", "chief 0")
    }, logs
    (record,) = (model_dir / "failures").glob("*.json")
    assert json.loads(record.read_text())["line"] == (
        "worker 0 on localhost: its command failed; its output says why (exit 1)"
    )
    table = runs_table(tmp_path)
    assert re.search(r"^mine +failed ", table, re.M), table
    assert "mine: first to fail: worker 0 on localhost: its command failed" in table


def test_told_its_model_dir_the_chief_says_the_run_is_done(tmp_path: Path) -> None:
    base, model_dir = free_port_block(4), tmp_path / "made" / "here"
    step = [wrapped(base, 4, rank, f"--model_dir={model_dir}", *SERVER, "1") for rank in range(4)]
    statuses, logs = ended(step, 60)
    assert statuses == [0, 0, 0, 0], logs
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], state["experiment"]) == ("done", Path(sys.executable).name)
    assert not (model_dir / "failures").exists()
    assert state["command"] == [*SERVER, "1"]
    # The runtime's run of another experiment (mnist_deep, done): refused in one line, its
    # record untouched (it was written over, with that run's metrics left for this one).
    state = {"experiment": "mnist_deep", "state": "done", "hparams": {"dropout": 0.5}}
    (model_dir / "state.json").write_text(json.dumps(state))
    refused = wrapped(base, 4, 2, f"--model_dir={model_dir}", *SERVER, "1")
    _, stderr = refused.communicate(timeout=60)
    assert refused.returncode == 2, stderr
    assert stderr.splitlines()[-1] == (
        f"with-tfconfig: --model_dir: names {model_dir}, a run of 'mnist_deep', not of "
        f"'{Path(sys.executable).name}': it would resume another model's checkpoints and write "
        "over that run's record. HINT: give this run a --model_dir of its own"
    )
    assert json.loads((model_dir / "state.json").read_text()) == state


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_told_its_model_dir_a_chief_sent_sigterm_says_the_run_stopped(
    tmp_path: Path, number: signal.Signals
) -> None:
    """SIGINT and SIGHUP alike: each reaches the command, which stops on it; also where the
    step was started ignoring them, as a script's background job ignores SIGINT and nohup
    SIGHUP (the command inherited that, and never stopped: a CI run under nohup)."""
    base, model_dir = free_port_block(4), tmp_path / "mine"
    ignoring = (signal.SIGINT, signal.SIGHUP)
    step = [
        wrapped(base, 4, rank, f"--model_dir={model_dir}", *SERVER, "600", ignoring=ignoring)
        for rank in range(4)
    ]
    state = model_dir / "state.json"
    try:
        assert wait_until(state.exists, 30.0)
        assert json.loads(state.read_text())["state"] == "running"
        # Once the command listens: a Python signalled as it starts (importing its site
        # module) exits 1, its own fatal error, before it could stop on the signal.
        assert wait_until(lambda: answer_of(f"localhost:{base + 2}") == b"", 30.0)
        step[2].send_signal(number)
        assert step[2].wait(timeout=30) == 128 + number
    finally:
        _, logs = ended(step, 0)
    said = json.loads(state.read_text())
    assert (said["state"], said["signal"]) == ("stopped", number.name)
    # A stop, not a failure, in the log as in the state.
    assert f"chief 0: its command stopped on {number.name}; saying so on its port" in logs, logs
    assert "chief 0: its command failed" not in logs
    assert re.search(rf"^mine +stopped \({number.name}\) ", runs_table(tmp_path), re.M)


# One node of 4 tasks laid out for ParameterServerStrategy: ps 0, the coordinator (chief 0),
# worker 0 and worker 1, by rank.
COORDINATED = "--coordinator"
# SERVER, but it fails its first time (exit 1 at once), and serves its seconds the next.
FAILS_ONCE = [
    "sh",
    "-c",
    'if [ -e "$1" ]; then shift; exec "$@"; fi; touch "$1"; exit 1',
    "fails-once",
]


def test_the_coordinator_s_exit_ends_every_server_and_worker_exit_0() -> None:
    step = wrap_step(free_port_block(4), 4, {1: "2"}, "600", COORDINATED)
    statuses, logs = ended(step, 60)
    assert statuses == [0, 0, 0, 0], logs
    assert "chief 0 (the coordinator): its command finished" in logs
    assert "ps 0: the coordinator finished; ending its command" in logs
    assert "worker 1: the coordinator finished; ending its command" in logs


def test_a_coordinator_s_worker_whose_command_fails_starts_it_again(tmp_path: Path) -> None:
    """The coordinator carries on without worker 1 while its wrapper starts its command again;
    the step still ends exit 0."""
    base, marker = free_port_block(4), str(tmp_path / "failed-once")
    step = [
        wrapped(base, 4, rank, *SERVER, "6" if rank == 1 else "600", layout=COORDINATED)
        if rank != 3
        else wrapped(base, 4, rank, *FAILS_ONCE, marker, *SERVER, "600", layout=COORDINATED)
        for rank in range(4)
    ]
    statuses, logs = ended(step, 60)
    assert statuses == [0, 0, 0, 0], logs
    assert (
        "worker 1: its command failed with exit status 1; starting it again on its port "
        "(restart 1 of at most 3)"
    ) in logs


@pytest.mark.parametrize(
    ("rank", "named"), [(1, "chief 0"), (0, "ps 0")], ids=["coordinator", "ps"]
)
def test_a_failed_coordinator_or_ps_ends_every_task_by_name(rank: int, named: str) -> None:
    base = free_port_block(4)
    statuses, logs = ended(wrap_step(base, 4, {rank: "-2"}, "600", COORDINATED), 60)
    assert statuses[rank] == 1, (statuses, logs)
    assert None not in statuses and 0 not in statuses, (statuses, logs)
    assert f"{named} at localhost:{base + rank} says its command failed" in logs
    if named == "ps 0":
        assert "ps 0: its command failed with exit status 1; its log above may say why" in logs


def test_a_coordinator_s_worker_told_to_stop_does_not_start_its_command_again() -> None:
    """scancel's SIGTERM reaches the worker's wrapper and its command: a stop, not a failure."""
    base = free_port_block(4)
    step = wrap_step(base, 4, {}, "600", COORDINATED)
    try:
        # Its command listening: the wrapper passes signals on by then.
        assert wait_until(lambda: answers(f"localhost:{base + 3}"), 30.0)
        step[3].terminate()
        assert step[3].wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        _, logs = ended(step, 0)
    assert "starting it again" not in logs


def test_keras3_in_an_environment_without_jax_is_one_line() -> None:
    """The command is this environment's Python, which has Keras 2 and no JAX (TensorFlow
    2.15's): the script would fail in every task with a traceback of keras.distribution."""
    python = Path(sys.executable)
    refused = subprocess.run(
        [WRAPPER, "--keras3", "python", "-c", "import keras; keras.distribution"],
        env={
            "PATH": f"{python.parent}:{os.environ['PATH']}",
            "TFCONFIG_SLURM_PYTHON": str(python),
            **task_env(["localhost"], [2], 0),
        },
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    needs = f"needs Keras 3 with JAX, and this Python {sys.version_info[0]}.{sys.version_info[1]}"
    assert refused.stderr.startswith(f"with-tfconfig: --keras3: {needs} has Keras 2"), (
        refused.stderr
    )
    assert refused.stderr.count("\n") == 1 and "make venv-keras3" in refused.stderr
    # The same from the call a script under plain srun makes, not JAX's missing module.
    called = subprocess.run(
        [sys.executable, "-c", "import tfconfig_slurm; tfconfig_slurm.keras_distribution()"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # In one line and exit 2, as the Python API's other calls end on bad input.
    assert called.returncode == 2, called.stderr
    assert called.stderr.startswith(f"python: keras_distribution(): {needs} has Keras 2"), (
        called.stderr
    )
    assert called.stderr.count("\n") == 1


def test_a_model_dir_held_by_another_job_s_script_is_refused_in_one_line(tmp_path: Path) -> None:
    """Job 71's script trains in --model_dir; job 72's, started meanwhile with the same one,
    is refused before its command runs (they had shared one state.json: a newcomer's), and
    starts once job 71's has ended and freed it."""
    run, base = tmp_path / "run", free_port_block(2)

    def job(port: int, *command: str) -> list[str]:
        return [WRAPPER, "--all_reduce", f"--port_base={port}", f"--model_dir={run}", *command]

    def environ(job_id: int) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "TFCONFIG_SLURM_PYTHON": sys.executable,
            **task_env(["localhost"], [1], 0, job_id=job_id),
        }

    # Job 71's command ends once job 72's has been refused, not after a while: a loaded
    # machine once started job 72's after job 71's had freed the directory.
    refused = tmp_path / "refused"
    waits = (
        f"import pathlib, time\nwhile not pathlib.Path({str(refused)!r}).exists(): time.sleep(0.1)"
    )
    first = subprocess.Popen(
        job(base, sys.executable, "-c", waits), env=environ(71), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until((run / "state.json").exists, 30.0)
        second = subprocess.run(
            job(base + 1, "touch", str(tmp_path / "ran")),
            env=environ(72), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        refused.touch()
        assert second.returncode == 2, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(
            f"with-tfconfig: --model_dir: {run} is held by another run, SLURM job 71"
        ), line
        assert "HINT: give this run a --model_dir of its own" in line, line
        assert not (tmp_path / "ran").exists()
        assert first.wait(timeout=60) == 0, first.stderr and first.stderr.read()
    finally:
        first.kill()
    again = subprocess.run(
        job(base + 1, "touch", str(tmp_path / "ran")),
        env=environ(72), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "ran").exists()
    assert json.loads((run / "state.json").read_text())["job_id"] == "72"
    # A run stopped (scancel, a requeue) keeps the directory for its job's next attempt.
    stopped = subprocess.Popen(
        job(base, sys.executable, "-c", "import time; time.sleep(60)"),
        env=environ(73), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(
            lambda: json.loads((run / "state.json").read_text()).get("job_id") == "73", 30.0
        )
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(timeout=60) != 0
    finally:
        stopped.kill()
    assert json.loads((run / "state.json").read_text())["state"] == "stopped"
    later = subprocess.run(
        job(base + 1, "true"), env=environ(74), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert later.returncode == 2 and "held by another run, SLURM job 73" in later.stderr

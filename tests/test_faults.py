"""A task killed mid-training ends the whole job fast, with a non-zero exit, and the log
names the task that died: on the real SLURM cluster (where srun without --kill-on-bad-exit
would otherwise wait for the hung survivors forever) and in --local_cluster mode."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests import fake_backend
from tests.cli import (
    PACED,
    REPOSITORY,
    checkpoint_step,
    ended_within,
    highest_step,
    read_logs,
    saved_step,
    wait_for,
    wait_until,
)
from tests.slurm_cluster import (
    TRAINING,
    SlurmCluster,
    assert_restarted_once,
    completed_in_its_job,
    finish,
    hung_and_restarted,
    job_id_of,
    release,
    said_requeued,
    submit,
    wait_for_end,
    warn_and_requeue,
)
from tfconfig_slurm.process import timing

# The tests of the machinery around the steps train the test suite's fake backend
# (tests/fake_backend.py), which starts no TensorFlow; those marked tensorflow train Estimator,
# each the end-to-end test of a behaviour that Estimator's checkpoints or barriers could fail.
FAKE = fake_backend.environ()

# Every fault must end the job within this; a hang is what the test exists to catch.
END_SECONDS = 60.0
# Starting four TensorFlow processes on 2 cores and reaching the first steps.
START_SECONDS = 180.0
# Every trainer logs its global step at every step, so that a test knows the last one reached.
TRAIN_FOREVER = (f"--experiment={PACED}", "--train_steps=1000000", "--log_every_steps=1")
CHECKPOINT_STEPS = 20
# A run restarted in its job, on the fake backend: its trainers are held at HELD_STEP until
# the test has killed a task or cut a node off (fake_backend.HOLD), as 40 global steps a
# second would otherwise finish it first (seen in CI), then train to RESTARTED_STEPS.
HELD_STEP = 60
RESTARTED_STEPS = 150


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("rank", "victim", "environ"),
    [
        (2, r"ps 1 at node\d:", FAKE),
        (3, r"worker 0 at node\d:", FAKE),
        # Estimator's, resumed once: the checkpoint is the chief's whichever task died. One
        # node of a ps, the chief and a worker (the fake cases span the nodes).
        pytest.param(1, r"chief 0 at node\d:", {}, marks=pytest.mark.tensorflow),
    ],
    ids=["ps-fake", "worker-fake", "chief"],
)
def test_a_killed_task_ends_the_step_and_is_named(
    slurm_cluster: SlurmCluster, tmp_path: Path, rank: int, victim: str, environ: dict[str, str]
) -> None:
    nodes, tasks_per_node = ("node[1-2]", 2) if environ else ("node1", 3)
    step = srun_training(
        slurm_cluster, tmp_path, "first", *TRAIN_FOREVER[1:], nodes=nodes,
        environ=environ, tasks_per_node=tasks_per_node,
    )  # fmt: skip
    logs = tmp_path / "first"
    try:
        wait_for(lambda: read_logs(logs), TRAINING, START_SECONDS)
        # A checkpoint interval or more into training.
        model_dir = tmp_path / "paced"
        assert wait_until(lambda: saved_step(model_dir) >= CHECKPOINT_STEPS, START_SECONDS)
        heard_of_each_other()
        reached = highest_step(read_logs(logs))
        os.kill(slurm_cluster.task_pid(rank), signal.SIGKILL)
        ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    survivors = read_logs(logs)
    assert step.returncode != 0
    assert re.search(rf"{victim}\d+ has not answered for \d+ s", survivors), survivors[-3000:]
    assert slurm_cluster.left_behind() == {}
    # Every trainer logs every global step it reaches: of those reached when the task was
    # killed, at most one checkpoint interval and the steps in flight are not in the last
    # checkpoint. (Steps the others took after the kill, until the watchdog ended them,
    # could never be saved by a dead chief.)
    assert reached - checkpoint_step(model_dir) <= CHECKPOINT_STEPS + 2
    if environ:
        return
    # The next run resumes from that checkpoint: on one node, a ps and the chief, as the
    # checkpoint does not depend on the layout.
    resumed_from = checkpoint_step(model_dir)
    rerun = srun_training(
        slurm_cluster,
        tmp_path,
        "second",
        f"--train_steps={resumed_from + 5}",
        "--log_every_steps=1",
        nodes="node1",
    )
    assert rerun.wait(timeout=START_SECONDS) == 0, read_logs(tmp_path / "second")[-3000:]
    # The step stored in a checkpoint may be a step or two past its name: asynchronous
    # workers update the ps's global step while the chief writes it (seen: ckpt-21 held 22).
    resumed = re.search(r"resuming from step (\d+)", read_logs(tmp_path / "second"))
    assert resumed is not None
    assert resumed_from <= int(resumed.group(1)) <= resumed_from + 2
    assert checkpoint_step(model_dir) >= resumed_from + 5


def srun_training(
    cluster: SlurmCluster,
    root: Path,
    logs: str,
    *flags: str,
    nodes: str = "node[1-2]",
    environ: Mapping[str, str] = {},
    tasks_per_node: int = 2,
) -> subprocess.Popen[str]:
    """The paced experiment in a step of a ps and trainers on each node (one, by default), a
    GPU each, one log per task in root/logs, `environ` in its environment; no
    --kill-on-bad-exit: SLURM then waits for every task, so only the runtime can end the
    survivors of a fault."""
    (root / logs).mkdir()
    return subprocess.Popen(
        [
            *("srun", f"--nodelist={nodes}", f"--ntasks-per-node={tasks_per_node}"),
            f"--gres=gpu:{tasks_per_node - 1}",
            f"--output={root / logs}/%t.log",
            *(sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={root}"),
            f"--experiment={PACED}",
            f"--save_checkpoints_steps={CHECKPOINT_STEPS}",
            *flags,
        ],
        env=cluster.environ(**environ),
        cwd=REPOSITORY,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("victim", ["ps 0", "worker 1", "chief 0"])
def test_a_killed_local_task_ends_the_cluster_and_is_named(tmp_path: Path, victim: str) -> None:
    console = tmp_path / "console.log"
    with console.open("w") as output:
        cluster = subprocess.Popen(
            [
                *(sys.executable, "-m", "tfconfig_slurm.run", f"--output_root={tmp_path}"),
                "--local_cluster=ps=1,workers=2",
                *TRAIN_FOREVER,
            ],
            env={**os.environ, **FAKE},
            cwd=REPOSITORY,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(console.read_text, TRAINING, START_SECONDS)
        pid = int(wait_for(console.read_text, rf"started {victim} at \S+ \(pid (\d+)\)", 1)[1])
        os.kill(pid, signal.SIGKILL)
        ended_within(cluster, END_SECONDS)
    finally:
        if cluster.poll() is None:
            cluster.kill()
    assert cluster.returncode == 1
    assert f"{victim} (pid {pid}) was killed by SIGKILL" in console.read_text()


# A stock Estimator script's stand-in (it imports no TensorFlow): what only Estimator can fail
# under with-tfconfig keeps its test with the real one (test_slurm.py).
STOCK = REPOSITORY / "tests" / "fixtures" / "stock_script.py"
WITH_TFCONFIG = REPOSITORY / "launch" / "with-tfconfig"


@pytest.mark.slurm
@pytest.mark.parametrize(("victim", "rank"), [("ps 1", 2), ("chief 0", 1)])
def test_a_killed_script_under_with_tfconfig_ends_a_plain_srun_step(
    slurm_cluster: SlurmCluster, tmp_path: Path, victim: str, rank: int
) -> None:
    """A stock script's process killed, as by the OOM killer, in a step without
    --kill-on-bad-exit: the supervisors of the others see its port fall silent."""
    model_dir = tmp_path / "model"
    step = subprocess.Popen(
        ["srun", "--nodes=2", "--ntasks-per-node=2", str(WITH_TFCONFIG), "python", str(STOCK),
         str(model_dir), "1000000"],
        env=slurm_cluster.environ(), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Training is under way once its first checkpoint is written.
        if not wait_until((model_dir / "checkpoint").exists, START_SECONDS):
            step.kill()
            pytest.fail(f"no checkpoint:\n{step.communicate()[1][-3000:]}")
        heard_of_each_other()
        os.kill(slurm_cluster.task_pid(rank, running=STOCK.name), signal.SIGKILL)
        ended_within(step, END_SECONDS)
    finally:
        if step.poll() is None:
            step.kill()
    _, stderr = step.communicate()
    assert step.returncode != 0
    # Its wrapper says the command failed; were the wrapper gone too, its port falls silent.
    said = rf"{victim} at node\d:\d+ (says its command failed|has not answered for \d+ s)"
    assert re.search(said, stderr), stderr[-3000:]
    assert slurm_cluster.left_behind() == {}


# A stock script's run that a killed worker restarts once in its job: held at HELD_STEP until
# the step has started again.
STOCK_STEPS = 150


@pytest.mark.slurm
def test_a_stock_script_s_killed_worker_under_with_tfconfig_restarts_the_step_in_its_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The one line of a user's batch script, `tfconfig-slurm srun` around with-tfconfig around
    a stock script: worker 0's script killed -9 once it has checkpointed, the step starts
    again in the same job, the script resumes from its checkpoint, and the job completes with
    the restart and its cause in state.json. (The plain srun step's ends for the worker are
    this test's first half.)"""
    model_dir = tmp_path / "model"
    hold = held(tmp_path, "model")[fake_backend.HOLD]
    (tmp_path / "job.sbatch").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --output=job.out\n"
        f"export {fake_backend.HOLD}={hold}\n"
        f"tfconfig-slurm srun --model_dir={model_dir} -- {WITH_TFCONFIG} --model_dir={model_dir} "
        f"python {STOCK} {model_dir} {STOCK_STEPS}\n"
    )
    job_id = slurm_cluster.sbatch(tmp_path, "job.sbatch")
    output = tmp_path / "job.out"
    try:
        assert wait_until((model_dir / "checkpoint").exists, START_SECONDS)
        heard_of_each_other()
        # The one checkpoint before the hold at HELD_STEP: the chief's first step past 50.
        at_kill = checkpoint_step(model_dir)
        os.kill(slurm_cluster.task_pid(3, running=STOCK.name), signal.SIGKILL)
        wait_for(output.read_text, "starting the step again", END_SECONDS)
        let_train_on(tmp_path, "model")
        ended = wait_for_end(slurm_cluster, job_id)
    finally:
        slurm_cluster.run(["scancel", job_id])
    said = output.read_text()
    assert (ended["JobState"], ended["Restarts"]) == ("COMPLETED", "0"), said[-3000:]
    assert_restarted_once(said, model_dir, job_id, rf"from the checkpoint of step {at_kill}")
    assert checkpoint_step(model_dir) == STOCK_STEPS


@pytest.mark.slurm
def test_usr1_checkpoints_requeues_and_resumes_losing_no_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """As `#SBATCH --signal=USR1@90` warns a job before its time limit."""
    job = submit(
        slurm_cluster,
        tmp_path,
        "preempted",
        f"--experiment={PACED}",
        "--train_steps=300",
        environ=held(tmp_path, "preempted"),
    )
    logs = tmp_path / "preempted" / "logs"
    job_id, ended = warn_and_requeue(
        slurm_cluster,
        job,
        logs,
        start_seconds=START_SECONDS,
        end_seconds=END_SECONDS,
        signalled=lambda: let_train_on(tmp_path, "preempted"),
    )
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "1")
    log = read_logs(logs)
    stopped_at = [
        int(step) for step in re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    ]
    assert len(stopped_at) == 2  # the chief and the worker, each at a step boundary
    assert said_requeued(log, job_id), log[-3000:]
    resumed = re.findall(r"chief 0 on node\d .* resuming from step (\d+)", log)
    assert resumed == [str(max(stopped_at))]  # every step taken before the signal is kept
    assert checkpoint_step(tmp_path / "preempted") >= 300


@pytest.mark.slurm
def test_a_job_that_may_not_requeue_goes_on_in_a_new_job_losing_no_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """`sbatch --no-requeue`, warned with SIGUSR1: SLURM refuses the requeue, and the run goes
    on in its batch script submitted again, with its arguments (one with a space in it), after
    the job ends."""
    experiment = tmp_path / "my experiments" / "paced.py"
    experiment.parent.mkdir()
    experiment.write_text(PACED.read_text())
    job = submit(
        slurm_cluster,
        tmp_path,
        "continued",
        f"--experiment={experiment}",
        "--train_steps=300",
        nodes="node[1-2]",
        sbatch_options=["--no-requeue"],
        environ=held(tmp_path, "continued"),
    )
    logs = tmp_path / "continued" / "logs"
    next_id = ""
    try:
        wait_for(lambda: read_logs(logs), TRAINING, START_SECONDS)
        job_id = job_id_of(logs)
        signalled = slurm_cluster.run(["scancel", "--signal=USR1", job_id])
        assert signalled.returncode == 0, signalled.stderr
        let_train_on(tmp_path, "continued")
        first = finish(slurm_cluster, job)
        pattern = r"so the run goes on in job (\d+)"
        next_id = wait_for(lambda: read_logs(logs), pattern, END_SECONDS).group(1)
        second = wait_for_end(slurm_cluster, next_id)
    finally:
        if not next_id or slurm_cluster.job(next_id)["JobState"] != "COMPLETED":
            slurm_cluster.cancel_all()
    assert (first["JobState"], first["ExitCode"], first["Requeue"]) == ("COMPLETED", "0:0", "0")
    assert (second["JobState"], second["ExitCode"]) == ("COMPLETED", "0:0"), second
    assert second["Command"] == first["Command"]  # the same script, with its arguments
    assert (second["NumNodes"], second["NumTasks"], second["TresPerNode"]) == (
        "2",
        "4",
        "gres:gpu:1",
    )
    log = read_logs(logs)
    assert f"job {job_id} may not requeue itself (Requeue=0): a stop on the time limit" in log
    assert "(continuation 1 of at most 3)" in log
    stopped_at = [
        int(step) for step in re.findall(r"stopping on SIGUSR1 at global step (\d+)", log)
    ]
    assert len(stopped_at) == 2, log[-3000:]
    resumed = re.findall(r"chief 0 on node\d .* resuming from step (\d+)", log)
    assert resumed == [str(max(stopped_at))]
    assert checkpoint_step(tmp_path / "continued") >= 300
    table = slurm_cluster.run(
        ["python", "-m", "tfconfig_slurm.commands", "runs", str(tmp_path), "--json"]
    )
    (run,) = json.loads(table.stdout)
    assert (run["state"], run["job_id"], run["continued_as"]) == ("done", next_id, None)


# A user's own batch script: no --signal, a time limit of one minute. Its runs' logs follow
# each other in the same files.
LIMITED_SCRIPT = """#!/bin/bash
#SBATCH --requeue
export {fake}
srun --cpu-bind=none --open-mode=append --output={logs}/%t.log {python} -m tfconfig_slurm.run \\
    --experiment={experiment} --output_root={root} --train_steps={steps} --log_every_steps=1 \\
    --save_checkpoints_steps=20
"""
# More than a paced trainer (20 steps a second at most) takes in the 28 s the first run
# trains, and in what the second would train before the stop it planned (28 s again): it
# trains on past that stop only because the limit was raised (by 2 minutes, time enough for
# the rest at half that speed).
LIMITED_STEPS = 1300


# Its 80 s of waiting for the minute's limit on the second partition, beside the first's tests.
@pytest.mark.slurm
@pytest.mark.second_partition
def test_a_time_limit_without_signal_stops_requeues_and_a_raised_limit_moves_the_stop(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The runtime asks squeue for the time left, and stops the job before it (at most half
    of what was left at start: here about 26 s before the minute ends), as on SIGUSR1. The
    job's next run, its limit raised to 3 minutes meanwhile, goes on past the stop it had
    planned and trains to its steps: every step over two runs, none lost."""
    logs = tmp_path / "logs"
    logs.mkdir()
    script = tmp_path / "limited.sbatch"
    script.write_text(
        LIMITED_SCRIPT.format(
            logs=logs,
            python=sys.executable,
            root=tmp_path,
            experiment=PACED,
            steps=LIMITED_STEPS,
            fake=shlex.join(f"{name}={value}" for name, value in FAKE.items()),
        )
    )
    submitted = slurm_cluster.run(
        ["sbatch", "--parsable", "--time=1", "--nodes=1", "--ntasks-per-node=2",
         "--gres=gpu:1", f"--nodelist={slurm_cluster.nodes[0]}", str(script)],
        cwd=tmp_path,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    plan = rf"job {job_id} ends at its time limit at [\d:]+: this run stops at"
    try:
        wait_for(
            lambda: slurm_cluster.run(["scontrol", "show", "job", job_id]).stdout,
            r"(?s)JobState=PENDING.*Restarts=1",
            START_SECONDS,
        )
        table = slurm_cluster.run(
            ["python", "-m", "tfconfig_slurm.commands", "runs", str(tmp_path), "--json"]
        )
        first, first_checkpoint = read_logs(logs), checkpoint_step(tmp_path / "paced")
        release(slurm_cluster, job_id)
        wait_for(lambda: read_logs(logs), rf"(?s){plan}.*{plan}", START_SECONDS)
        raised = slurm_cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=3"])
        assert raised.returncode == 0, raised.stderr
        ended = wait_for_end(slurm_cluster, job_id)
    finally:
        slurm_cluster.run(["scancel", job_id])
    # The chief, which owns the run, says why it stopped, though it only heard SIGUSR1.
    (run,) = json.loads(table.stdout)
    assert (run["state"], run["stopped_by"]) == ("requeued", "time limit"), run
    assert re.search(plan, first)
    assert re.search(rf"job {job_id} reaches its time limit in \d+ s: stopping every task", first)
    stopped_at = [
        int(step) for step in re.findall(r"stopping on SIGUSR1 at global step (\d+)", first)
    ]
    assert len(stopped_at) == 1, first[-3000:]  # the chief, its one trainer
    assert said_requeued(first, job_id), first[-3000:]
    assert first_checkpoint == stopped_at[0]
    # The second run: the limit raised, it did not stop again, and lost no step.
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "1")
    log = read_logs(logs)
    assert re.search(rf"job {job_id}'s time limit moved to [\d:]+: this run now stops at", log)
    assert re.findall(r"stopping on SIGUSR1 at global step (\d+)", log) == [str(stopped_at[0])]
    resumed = rf"chief 0 on {slurm_cluster.nodes[0]} .* resuming from step (\d+)"
    assert re.findall(resumed, log) == [str(stopped_at[0])]
    assert checkpoint_step(tmp_path / "paced") >= LIMITED_STEPS
    done = slurm_cluster.run(["python", "-m", "tfconfig_slurm.commands", "runs", str(tmp_path)])
    assert re.search(r"(?m)^paced +done +\d+", done.stdout), done.stdout


@pytest.mark.slurm
@pytest.mark.parametrize(
    ("updates", "environ"),
    [((), FAKE), pytest.param(("--sync_replicas",), {}, marks=pytest.mark.tensorflow)],
    ids=["async-fake", "sync"],
)
def test_scancel_checkpoints_every_step_taken_and_resubmitting_resumes(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    updates: tuple[str, ...],
    environ: dict[str, str],
) -> None:
    """scancel, a time limit and a preemption without --signal send SIGTERM, then SIGKILL
    after KillWait (30 s): every step taken before it is kept, Estimator's synchronous updates
    too. One node: a ps, the chief and a worker (SLURM signals every node's tasks alike)."""
    job = submit(
        slurm_cluster, tmp_path, "cancelled", *TRAIN_FOREVER, *updates, nodes="node1",
        sbatch_options=("--nodes=1", "--ntasks-per-node=3", "--gres=gpu:2"), environ=environ,
    )  # fmt: skip
    logs = tmp_path / "cancelled" / "logs"
    try:
        wait_for(lambda: read_logs(logs), TRAINING, START_SECONDS)
        job_id = job_id_of(logs)
        cancelled = slurm_cluster.run(["scancel", job_id])
        assert cancelled.returncode == 0, cancelled.stderr
        # Until its tasks have gone the job is COMPLETING, and holds its model directory.
        ended = finish(slurm_cluster, job)
    finally:
        if job.poll() is None:
            job.kill()
    assert ended["JobState"] == "CANCELLED"
    log = read_logs(logs)
    stopped_at = [
        int(step) for step in re.findall(r"stopping on SIGTERM at global step (\d+)", log)
    ]
    assert len(stopped_at) == 2, log[-3000:]  # the chief and the worker, before SIGKILL
    assert environ or re.search(r"ps 0: 2 of 2 trainers finished", log)
    assert checkpoint_step(tmp_path / "cancelled") == max(stopped_at)

    # Resumed on one node: a ps and the chief.
    again = submit(
        slurm_cluster, tmp_path, "cancelled", f"--experiment={PACED}",
        f"--train_steps={max(stopped_at) + 5}", *updates,
        nodes="node1", sbatch_options=("--nodes=1",), environ=environ,
    )  # fmt: skip
    resumed = finish(slurm_cluster, again)
    assert (resumed["JobState"], resumed["ExitCode"]) == ("COMPLETED", "0:0"), resumed["stderr"]
    assert f"resuming from step {max(stopped_at)}" in read_logs(logs)


def paced_job(
    cluster: SlurmCluster,
    root: Path,
    name: str,
    nodes: str = "",
    sbatch_options: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], Path]:
    """The paced run to RESTARTED_STEPS on the fake backend, a checkpoint every
    CHECKPOINT_STEPS, held at HELD_STEP until let_train_on, submitted as `name`: the sbatch
    --wait client and the run's task logs."""
    job = submit(
        cluster, root, name, f"--experiment={PACED}", f"--train_steps={RESTARTED_STEPS}",
        "--log_every_steps=1", f"--save_checkpoints_steps={CHECKPOINT_STEPS}", nodes=nodes,
        sbatch_options=sbatch_options, environ=held(root, name),
    )  # fmt: skip
    return job, root / name / "logs"


def held(root: Path, name: str) -> dict[str, str]:
    """The environment of a run `name` on the fake backend whose trainers take no step past
    HELD_STEP until let_train_on: a fault or a signal then comes before it could finish."""
    return {**FAKE, fake_backend.HOLD: f"{HELD_STEP}:{root / f'{name}-released'}"}


def let_train_on(root: Path, name: str) -> None:
    """The held run `name` trains on (its restart or its requeued run)."""
    (root / f"{name}-released").touch()


def heard_of_each_other() -> None:
    """Waits two watchdog probe rounds (of a task's one peer): a task lost before any watcher
    heard from it is waited for as one still starting (timing.START_SECONDS). The fake
    backend's trainers reach a checkpoint within a second of their start."""
    time.sleep(2 * timing.PROBE_SECONDS)


def at_step_40(logs: Path) -> None:
    """Waits for the run of `logs` to train to step 40, its tasks heard of each other."""
    wait_for(lambda: read_logs(logs), TRAINING, START_SECONDS)
    assert wait_until(lambda: highest_step(read_logs(logs)) >= 40, START_SECONDS)
    heard_of_each_other()


def trained_to_step_40(
    cluster: SlurmCluster, root: Path, name: str, nodes: str = ""
) -> tuple[subprocess.Popen[str], Path]:
    """paced_job's, trained to step 40."""
    job, logs = paced_job(cluster, root, name, nodes)
    try:
        at_step_40(logs)
    except BaseException:
        job.kill()
        raise
    return job, logs


@contextlib.contextmanager
def node2_cut_off(cluster: SlurmCluster) -> Iterator[float]:
    """node2's link down, as a switch port failing: the monotonic time of the cut. Afterwards
    its link is up again, the node back in service, and what its jobs left there ended."""
    subprocess.run(["ip", "link", "set", "tfsveth2", "down"], check=True)
    try:
        yield time.monotonic()
    finally:
        subprocess.run(["ip", "link", "set", "tfsveth2", "up"], check=True)
        cluster.run(["scontrol", "update", "nodename=node2", "state=resume"])
        cluster.clear("node2")


@pytest.mark.slurm
def test_a_node_cut_off_ends_the_job_and_slurm_requeues_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Slurm ends the job for its node's failure (NODE_FAIL) within SlurmdTimeout (15 s) + 60
    s, and requeues it (launch/train.sbatch asks for --requeue), which the batch script says;
    the tasks cut off end too. How a requeued run resumes is the USR1 requeue tests'; which
    nodes Slurm then gives it, Slurm's (docs/slurm.md: measured by hand)."""
    job, logs = trained_to_step_40(slurm_cluster, tmp_path, "cut", "node[1-2]")
    try:
        job_id = job_id_of(logs)
        with node2_cut_off(slurm_cluster) as cut:
            ended = wait_until(lambda: slurm_cluster.run_ended(job_id), 15.0 + END_SECONDS)
            took = time.monotonic() - cut
            state = slurm_cluster.job(job_id)
            # Said once srun has given up on node2's tasks (its 32 s), before the job goes.
            out = tmp_path / f"train-{job_id}.out"
            said = f"node2 failed, and Slurm ends job {job_id} and requeues it"
            wait_for(out.read_text, re.escape(said), END_SECONDS)
            slurm_cluster.run(["scancel", job_id])
            # The tasks cut off with node2 ended too, by the watchdog: none hangs there.
            assert wait_until(lambda: not runtime_left(slurm_cluster), 30.0), runtime_left(
                slurm_cluster
            )
    finally:
        job.kill()  # the sbatch --wait client only
        job.communicate()
    assert ended, f"the job still ran {took:.0f} s after node2 was cut off"
    # Restarts=1 is the requeue; the job may still be COMPLETING its first run then, on its
    # way back to PENDING (seen once in 5 CI runs).
    assert (state["JobState"], state["Restarts"]) in (("PENDING", "1"), ("COMPLETING", "1"))
    assert (
        f"tfconfig-slurm srun: {said}: the run resumes from its latest checkpoint then"
    ) in out.read_text()


@pytest.mark.slurm
def test_a_node_cut_off_restarts_a_no_kill_job_and_continues_one_that_may_not_requeue(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """node2 cut off under two jobs at once, each a ps and a trainer on node1 and node2 (one
    wait for Slurm to find the node down, not two).

    `sbatch --no-kill`: Slurm keeps the job on node1. The batch script ends the step that
    waits for node2's tasks and starts it again on node1, laid out again (a ps and the
    chief); the run resumes from its latest checkpoint and finishes every step in the job.

    `sbatch --no-requeue`: Slurm ends the job (NODE_FAIL). The batch script, told to stop,
    finds node2 gone and submits itself again, after the job, on 2 nodes without node2 (its
    --nodelist named node2, and is dropped): the run resumes from its checkpoint on node1 and
    node3 and finishes every step."""
    jobs = {
        name: paced_job(slurm_cluster, tmp_path, name, "node[1-2]", (option,))
        for name, option in (("nokill", "--no-kill"), ("continued", "--no-requeue"))
    }
    (kept, logs), (cut_short, continued_logs) = jobs["nokill"], jobs["continued"]
    try:
        for _, each in jobs.values():
            at_step_40(each)
        first = job_id_of(continued_logs)
        with node2_cut_off(slurm_cluster) as cut:
            reached = highest_step(read_logs(logs))
            ended_first = finish(slurm_cluster, cut_short)
            took_first = time.monotonic() - cut
            # Seconds from the cut to each run's resumption, as each comes.
            back: dict[str, float] = {}

            def resumed_both() -> bool:
                for name, (_, each) in jobs.items():
                    if name not in back and "resuming from step" in read_logs(each):
                        back[name] = time.monotonic() - cut
                return len(back) == len(jobs)

            assert wait_until(resumed_both, 60.0 + START_SECONDS), back
            # Only now: the trainers cut off count on through the shared disk until their
            # watchdogs end them, and could otherwise finish the run before its restart.
            for name in jobs:
                let_train_on(tmp_path, name)
            ended = finish(slurm_cluster, kept)
    finally:
        for job, _ in jobs.values():
            if job.poll() is None:
                job.kill()
    # The --no-kill job.
    output = completed_in_its_job(ended, tmp_path)
    cause = (
        "node2 left the job: its node failed, and the job (--no-kill) goes on with the nodes left"
    )
    again = re.search(
        rf"the step failed \(exit 137\): node2 left job {ended['JobId']}: its node failed; task "
        rf"logs in {logs}\ntfconfig-slurm srun: starting the step again in "
        rf"job {ended['JobId']} on the nodes left \(restart 1 of at most 2\), from the "
        rf"checkpoint of step (\d+): {re.escape(cause)}",
        output,
    )
    assert again is not None, output[-3000:]
    resumed = re.search(r"resuming from step (\d+)", read_logs(logs))
    assert resumed is not None and HELD_STEP >= int(resumed[1]) == int(again[1]) >= CHECKPOINT_STEPS
    # Laid out again on node1 alone: its ps and the chief, which trained to the end.
    assert re.search(r"chief 0 on node1 .*(?s:.*)resuming from step", read_logs(logs))
    assert checkpoint_step(tmp_path / "nokill") >= RESTARTED_STEPS
    state = json.loads((tmp_path / "nokill" / "state.json").read_text())
    assert (state["state"], [each["cause"] for each in state["restarts"]]) == ("done", [cause])
    # The --no-requeue job.
    assert ended_first["JobState"] == "NODE_FAIL", ended_first
    output = (tmp_path / f"train-{first}.out").read_text()
    went_on = re.search(
        rf"tfconfig-slurm srun: node2 failed, and Slurm ends job {first} and may not requeue "
        r"it \(Requeue=0\): the run goes on in job (\d+), submitted to start once this one has "
        r"ended, on 2 nodes without node2, from its latest checkpoint",
        output,
    )
    assert went_on is not None, output[-3000:]
    after = wait_for_end(slurm_cluster, went_on[1])
    assert (after["JobState"], after["ExitCode"], after["NodeList"]) == (
        "COMPLETED",
        "0:0",
        "node[1,3]",
    ), after
    # The run's first line in the new job: its chief restored the checkpoint.
    continued = re.search(r"resuming from step (\d+)", read_logs(continued_logs))
    assert continued is not None and HELD_STEP >= int(continued[1]) >= CHECKPOINT_STEPS
    assert checkpoint_step(tmp_path / "continued") >= RESTARTED_STEPS
    print(f"node2 cut off at step {reached}: the --no-kill run resumed {back['nokill']:.1f} s "
          f"later, from step {resumed[1]}; the --no-requeue job {first} ended {took_first:.1f} "
          f"s later, its run resumed in job {went_on[1]} {back['continued']:.1f} s after the "
          f"cut, from step {continued[1]}")  # fmt: skip


def runtime_left(cluster: SlurmCluster) -> list[str]:
    return [task for task in cluster.task_pids()["node2"] if "tfconfig_slurm" in task]


@pytest.mark.slurm
def test_an_error_in_the_experiment_ends_the_job_at_once_not_restarted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The chief raises at its 20th step: the job ends FAILED, not requeued, its step run
    once, the first to fail named with the error, and said not to start again (a bug would
    fail the same way)."""
    ended = finish(
        slurm_cluster,
        submit(
            slurm_cluster, tmp_path, "paced", f"--experiment={PACED}", "--train_steps=1000",
            environ={**FAKE, fake_backend.FAIL_AS: "chief 0@20"},
        ),
    )  # fmt: skip
    assert (ended["JobState"], ended["Restarts"]) == ("FAILED", "0"), ended
    output = (tmp_path / f"train-{ended['JobId']}.out").read_text()
    assert output.count("the step failed") == 1, output
    assert re.search(r"first to fail: chief 0 on node\d: .*breaks on purpose", output), output
    said = "tfconfig-slurm srun: not starting the step again: an error in the run's code"
    assert said in output, output
    assert "restarts" not in json.loads((tmp_path / "paced" / "state.json").read_text())


@pytest.mark.slurm
@pytest.mark.parametrize(("rank", "victim"), [(3, "worker 0"), (2, "ps 1")])
def test_a_killed_task_restarts_the_step_in_the_job_from_the_checkpoint(
    slurm_cluster: SlurmCluster, tmp_path: Path, rank: int, victim: str
) -> None:
    """A worker's, then a parameter server's, process killed -9 after the first checkpoints:
    the batch script names it as the first to fail, starts the step again in the same job (no
    requeue), and the run resumes from its latest checkpoint and trains to the end; the runs
    table and state.json keep the restart and its cause."""
    job, logs = trained_to_step_40(slurm_cluster, tmp_path, "named")
    try:
        reached = highest_step(read_logs(logs))
        os.kill(slurm_cluster.task_pid(rank), signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: read_logs(logs), r"resuming from step", START_SECONDS)
        let_train_on(tmp_path, "named")
        took = time.monotonic() - killed
        ended = finish(slurm_cluster, job)
    finally:
        if job.poll() is None:
            job.kill()
    output = completed_in_its_job(ended, tmp_path)
    second_node = re.search(rf"{victim} on (node\d)", read_logs(logs))
    assert second_node is not None
    # From the run's failure record, written by the first watcher to find the victim lost;
    # else (the step ended before any watcher looked) from srun's own message about its rank.
    node = second_node[1]
    named = re.search(
        rf"first to fail: ({victim} on {node}: stopped answering: killed, or its node cut off, "
        rf"seen by (ps|chief|worker) \d|task {rank}: Killed \({victim} on {node}\))",
        output,
    )
    assert named is not None, output
    again = re.search(
        rf"starting the step again in job {ended['JobId']} \(restart 1 of at most 2\), from "
        rf"the checkpoint of step (\d+): ({victim} stopped answering|a task was killed)",
        output,
    )
    assert again is not None, output
    resumed_from = int(again[1])
    # The restart trained: it resumed from the step the run was held at.
    assert CHECKPOINT_STEPS <= resumed_from <= HELD_STEP
    assert f"resuming from step {resumed_from}" in read_logs(logs)
    # Two trainers on parameter servers may both take the last step.
    assert checkpoint_step(tmp_path / "named") >= RESTARTED_STEPS
    assert re.search(
        rf"done at step \d+: .*; restarted 1x in its job: {again[2]}; task logs",
        output,
    ), output
    state = json.loads((tmp_path / "named" / "state.json").read_text())
    assert [each["cause"] for each in state["restarts"]] == [again[2]]
    print(f"{victim} killed at step {reached}: the run resumed {took:.1f} s later, from step "
          f"{resumed_from}")  # fmt: skip


@pytest.mark.slurm
def test_an_asynchronous_worker_that_hangs_is_named_alone_and_the_step_restarted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """#55: on parameter servers (the fake backend's Estimator-kind run) the chief goes on
    while worker 0 blocks for ever in its data at global step 40: the worker alone is found
    hung, waits for hung peers' accounts in vain, names itself, and the step starts again in
    the job from the latest checkpoint, where it does not hang again, and completes."""
    once = tmp_path / "hung-once"
    job = submit(
        slurm_cluster, tmp_path, "hangs", f"--experiment={PACED}", "--train_steps=600",
        "--log_every_steps=1", f"--save_checkpoints_steps={CHECKPOINT_STEPS}",
        "--hang_timeout=3",
        environ={**FAKE, fake_backend.HANG_AS: f"worker 0@40:{once}"},
    )  # fmt: skip
    ended = finish(slurm_cluster, job)
    output = completed_in_its_job(ended, tmp_path)
    hung_at, _, resumed = hung_and_restarted(
        output, ended["JobId"], at=r"\d+", silent="[34]", waits_in="fake_backend.py:LINE in _hang"
    )
    assert 30 <= hung_at <= 40
    # The chief trained on while the worker hung, and its account waited in vain for others.
    assert resumed > 100
    assert checkpoint_step(tmp_path / "hangs") >= 600
    assert "worker 0, thread MainThread (most recent call last):" in read_logs(
        tmp_path / "hangs" / "logs"
    )

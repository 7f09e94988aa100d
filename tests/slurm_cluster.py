"""The test suite's real SLURM cluster (tests/slurm/cluster), as fixtures: the cluster up for
the session (slurm_conf), and each test's partition of it (slurm_cluster).

Where it cannot start (not root, no apt), the tests that need it skip with the reason; with
TFCONFIG_SLURM_REQUIRE_SLURM=1, as in CI, that is a failure instead. Under tests/lanes, whose
lanes share the cluster, it is up before they start (LANES_CLUSTER), and no session starts or
stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tests.cli import REPOSITORY, read_logs, wait_for, wait_until

SCRIPT = REPOSITORY / "tests" / "slurm" / "cluster"
STATE = Path("/tmp/tfconfig-slurm-cluster")
# Set by tests/lanes, which starts the cluster for its lanes (and stops it after them), to the
# log of that start.
LANES_CLUSTER = "TFCONFIG_SLURM_TEST_LANES_CLUSTER"
# The cluster's partitions and their nodes (tests/slurm/cluster): the Estimator suite's tests
# run on the first, the TensorFlow 2.16+ and Keras 3 suites' on the second, side by side in
# tests/lanes; each test sees only its own partition's jobs and nodes.
PARTITIONS = {"debug": ("node1", "node2", "node3"), "second": ("node4", "node5")}
# A pending srun or sbatch --wait blocks forever: every call has a deadline.
CALL_SECONDS = 240.0
# In the logs of a 2-node job: both trainers have taken their first step.
TRAINING = r"(?s)first step done.*first step done"


SBATCH = REPOSITORY / "launch" / "train.sbatch"
# The smallest job with every role: per node one ps and one trainer on one of its GPUs.
SMALL_JOB = ("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:1")
# One process training alone: for what does not depend on the layout (a sweep, an array).
ONE_TASK = ("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1")


# Job states from which a job may still run (or run again).
_LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING"}


@dataclass(frozen=True)
class SlurmCluster:
    """Runs Slurm's client commands against one partition of the test cluster."""

    conf: Path
    partition: str = "debug"

    @property
    def nodes(self) -> tuple[str, ...]:
        return PARTITIONS[self.partition]

    def environ(self, **extra: str) -> dict[str, str]:
        """What a user's shell would hold: the cluster's config, this Python first on PATH,
        and (sbatch, srun and salloc read it) the partition."""
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        return {
            "PATH": path,
            "HOME": os.environ.get("HOME", "/root"),
            "SLURM_CONF": str(self.conf),
            "TFCONFIG_SLURM_PYTHON": sys.executable,
            **{f"{client}_PARTITION": self.partition for client in ("SBATCH", "SLURM", "SALLOC")},
            **extra,
        }

    def run(
        self,
        command: Sequence[str],
        cwd: Path = REPOSITORY,
        timeout: float = CALL_SECONDS,
        **extra: str,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command),
            env=self.environ(**extra),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def sbatch(self, workdir: Path, *arguments: str) -> str:
        """`sbatch --parsable ARGUMENTS`, as a user submits a batch script from `workdir`: the
        job's id."""
        submitted = self.run(["sbatch", "--parsable", *arguments], cwd=workdir)
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip().split(";")[0]

    def cancel_all(self) -> None:
        """Cancels every job of this partition's, as one left behind would start again amid
        later tests."""
        self.run(["scancel", "--user=root", f"--partition={self.partition}"])

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (there is no accounting database to ask sacct)."""
        shown = self.run(["scontrol", "show", "job", "--oneliner", job_id])
        assert shown.returncode == 0, shown.stderr
        return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))

    def run_ended(self, job_id: str) -> bool:
        """Whether a job's first run is over: the job ended, or was requeued (a batch job
        with --requeue is, when a node fails). Asked of scontrol, as sbatch --wait looks only
        every few seconds."""
        fields = self.job(job_id)
        return fields["JobState"] not in _LIVE_STATES or fields["Restarts"] != "0"

    def node_pids(self) -> dict[str, list[int]]:
        """The processes still running on each node, found by its network namespace."""
        found = {}
        for node in self.nodes:
            listed = subprocess.run(
                ["ip", "netns", "pids", f"tfs-{node}"], capture_output=True, text=True, check=True
            )
            found[node] = [int(pid) for pid in listed.stdout.split()]
        return found

    def task_pid(self, rank: int, running: str = "tfconfig_slurm.run", job_id: str = "") -> int:
        """The pid of a running task's process, by its rank in the step (of the job `job_id`
        names, where several run): by default the tfconfig_slurm runtime; else the command
        `running` names, not its with-tfconfig."""
        for pids in self.node_pids().values():
            for pid in pids:
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                command = _command_line(pid)
                if (
                    f"SLURM_PROCID={rank}".encode() in environ
                    and (not job_id or f"SLURM_JOB_ID={job_id}".encode() in environ)
                    and running in command
                    and "tfconfig_slurm.commands.with_tfconfig" not in command
                ):
                    return pid
        raise AssertionError(f"no task of rank {rank} runs {running} on any node")

    def clear(self, node: str) -> None:
        """Ends what jobs left on a node, as its reboot would: Slurm's slurmstepd on a node
        that was cut off outlives its job by minutes here."""
        for pid in self.node_pids()[node]:
            if not _is_slurmd(_command_line(pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def left_behind(self, seconds: float = 10.0) -> dict[str, list[str]]:
        """What jobs left on the nodes, by node, once `seconds` passed for it to go ({} when
        nothing): a step's slurmstepd outlives srun's return by a moment."""
        wait_until(lambda: not any(self.task_pids().values()), seconds)
        return {node: left for node, left in self.task_pids().items() if left}

    def task_pids(self) -> dict[str, list[str]]:
        """Processes on the nodes other than slurmd itself: what jobs left behind."""
        left = {}
        for node, pids in self.node_pids().items():
            commands = [_command_line(pid) for pid in pids]
            left[node] = [command for command in commands if command and not _is_slurmd(command)]
        return left


def submit(
    cluster: SlurmCluster,
    workdir: Path,
    experiment_id: str,
    *flags: str,
    nodes: str = "",
    sbatch_options: Sequence[str] = (),
    environ: Mapping[str, str] = {},
) -> subprocess.Popen[str]:
    """`sbatch --wait launch/train.sbatch`, as a user submits it from `workdir`;
    `sbatch_options` after the test's own, which they override; `environ` in the job's
    environment."""
    command = ["sbatch", "--wait", "--parsable", *SMALL_JOB, *sbatch_options]
    if nodes:
        command.append(f"--nodelist={nodes}")
    return subprocess.Popen(
        [*command, str(SBATCH), "--log_every_steps=10", *flags],
        env=cluster.environ(
            TFCONFIG_SLURM_OUTPUT=str(workdir), EXPERIMENT_ID=experiment_id, **environ
        ),
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(cluster: SlurmCluster, job: subprocess.Popen[str]) -> dict[str, str]:
    """Waits for a submitted job; its `scontrol show job` fields once it has ended (requeued
    runs included).

    Asked of scontrol every 0.2 s: `sbatch --wait` looks every 10 s, which cost a test up to
    10 s a job. Its client, which prints the job id at once, is then stopped.
    """
    assert job.stdout is not None
    job_id = job.stdout.readline().strip().split(";")[0]
    try:
        assert job_id.isdigit(), job.communicate(timeout=CALL_SECONDS)[1]
        fields = wait_for_end(cluster, job_id)
    finally:
        job.terminate()
        _, stderr = job.communicate()
    fields["stderr"] = stderr
    return fields


def said_requeued(log: str, job_id: str) -> bool:
    """Whether the task that requeues the job said it did: its `scontrol requeue` answered, or
    the requeue ended it, scontrol's own process among the job's, before the answer came,
    and the job's record said Restarts=1 (process/job/what_follows.py)."""
    return (
        re.search(
            rf"requeued job {job_id} \(requeue 1 of at most 3\)"
            rf"|`scontrol requeue {job_id}` said exit status -15, but the job was requeued",
            log,
        )
        is not None
    )


def completed_in_its_job(ended: Mapping[str, str], workdir: Path) -> str:
    """The `.out` of a job that `finish` saw end, which must have completed, exit 0, without a
    requeue (a restart inside the job is none)."""
    assert (ended["JobState"], ended["ExitCode"], ended["Restarts"]) == ("COMPLETED", "0:0", "0")
    return (workdir / f"train-{ended['JobId']}.out").read_text()


def wait_for_end(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """Waits for the job `job_id` to end; its `scontrol show job` fields then."""
    over = wait_until(lambda: cluster.job(job_id)["JobState"] not in _LIVE_STATES, CALL_SECONDS)
    assert over, f"job {job_id} still ran after {CALL_SECONDS:.0f} s"
    return cluster.job(job_id)


# How long after its processes are gone a requeued run's end still took to reach slurmctld.
_SETTLE_SECONDS = 3.0


def assert_restarted_once(output: str, model_dir: Path, job_id: str, resumed: str) -> None:
    """A batch job's `tfconfig-slurm srun` named worker 0, killed with SIGKILL, as the first
    to fail, started the step again once in job `job_id` (`resumed` says from where), and the
    run ended done with that restart and its cause in state.json."""
    assert re.search(
        r"first to fail: worker 0 on node\d: its command was killed by SIGKILL(?s:.*)"
        rf"tfconfig-slurm srun: starting the step again in job {job_id} \(restart 1 of at most "
        rf"2\), {resumed}: worker 0 was killed by SIGKILL",
        output,
    ), output[-3000:]
    state = json.loads((model_dir / "state.json").read_text())
    assert (state["state"], [each["cause"] for each in state["restarts"]]) == (
        "done",
        ["worker 0 was killed by SIGKILL"],
    )


def hung_and_restarted(
    output: str, job_id: str, *, at: str, silent: str, waits_in: str
) -> tuple[int, int, int]:
    """A batch job's `tfconfig-slurm srun` named worker 0 hung at a global step `at` (a
    pattern) after `silent` seconds (a pattern), waiting in its own code in `waits_in`
    (`file.py:LINE in function`, LINE matched), and started the step again once in job
    `job_id`: the step it hung at, the seconds said, and the checkpoint step it resumed from."""
    file, function = waits_in.split(":LINE in ")
    named = re.search(
        rf"first to fail: worker 0 on node\d: hung at global step ({at}): no step for ({silent}) "
        rf"s, waiting in its own code \({re.escape(file)}:\d+ in {function}\)",
        output,
    )
    assert named is not None, output[-3000:]
    again = re.search(
        rf"starting the step again in job {job_id} \(restart 1 of at most 2\), from the "
        rf"checkpoint of step (\d+): worker 0 hung at global step {named[1]}",
        output,
    )
    assert again is not None, output[-3000:]
    return int(named[1]), int(named[2]), int(again[1])


def release(cluster: SlurmCluster, job_id: str) -> None:
    """Lets a requeued job start again now rather than in 121 s, as Slurm holds it: once its
    first run has left the nodes and a moment more. Released at once, that run's end reached
    slurmctld 0.3 s after the second start and ended the job as FAILED (seen here)."""
    assert wait_until(lambda: not any(cluster.task_pids().values()), 60.0)
    time.sleep(_SETTLE_SECONDS)
    released = cluster.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    assert released.returncode == 0, released.stderr


def warn_and_requeue(
    cluster: SlurmCluster,
    job: subprocess.Popen[str],
    logs: Path,
    *,
    start_seconds: float,
    end_seconds: float,
    training: str = TRAINING,
    signalled: Callable[[], None] = lambda: None,
) -> tuple[str, dict[str, str]]:
    """Warns a submitted job with SIGUSR1 once its logs say `training`, as `#SBATCH
    --signal=USR1@90` warns it before its time limit (then calls `signalled`); waits for the
    job to requeue itself, lets it start again at once, and waits for its end: its id and
    `finish`'s fields."""
    try:
        wait_for(lambda: read_logs(logs), training, start_seconds)
        job_id = job_id_of(logs)
        warned = cluster.run(["scancel", "--signal=USR1", job_id])
        assert warned.returncode == 0, warned.stderr
        signalled()
        wait_for(
            lambda: cluster.run(["scontrol", "show", "job", job_id]).stdout,
            r"(?s)JobState=PENDING.*Restarts=1",
            end_seconds,
        )
        release(cluster, job_id)
        return job_id, finish(cluster, job)
    finally:
        # A requeued job left behind would start again in 2 minutes, amid later tests.
        if job.poll() is None:
            cluster.cancel_all()
            job.kill()


def job_id_of(logs: Path) -> str:
    """The id of the job whose task logs (launch/train.sbatch's) are in `logs`."""
    return next(logs.glob("job*-task0.log")).name.split("-")[0].removeprefix("job")


def _is_slurmd(command: str) -> bool:
    return command.startswith("slurmd ")


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def unavailable(reason: str) -> NoReturn:
    """Skips a test that needs root or the cluster here; fails it in CI, where it must run."""
    if os.environ.get("TFCONFIG_SLURM_REQUIRE_SLURM") == "1":
        pytest.fail(f"TFCONFIG_SLURM_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest, slurm_conf: Path) -> SlurmCluster:
    """The test's partition of the cluster (second_partition)."""
    return SlurmCluster(slurm_conf, "second" if second_partition(request.node) else "debug")


def second_partition(item: pytest.Item) -> bool:
    """Whether a test on the cluster runs on its second partition: those of the TensorFlow
    2.16+ and Keras 3 suites, and those marked to even the two lanes out."""
    return any(mark in item.keywords for mark in ("tf2", "keras3", "second_partition"))


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[Path]:
    """The cluster's config, the cluster started for the session unless it was already up
    (then left up), or tests/lanes started it."""
    if os.geteuid() != 0:
        unavailable("the SLURM test cluster needs root (network namespaces, Slurm daemons)")
    conf = STATE / "slurm.conf"
    lanes_log = os.environ.get(LANES_CLUSTER)
    if lanes_log:
        # Never `status` here: it says down while another lane's test has a node cut off.
        if not conf.exists():
            unavailable(f"tests/lanes could not start the SLURM test cluster (see {lanes_log})")
        yield conf
        return
    was_up = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if was_up.returncode != 0:
        started = subprocess.run(
            [str(SCRIPT), "up"], capture_output=True, text=True, timeout=600, check=False
        )
        if started.returncode != 0:
            unavailable(f"could not start the SLURM test cluster: {started.stderr.strip()}")
    try:
        yield conf
    finally:
        if was_up.returncode != 0:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120, check=False)

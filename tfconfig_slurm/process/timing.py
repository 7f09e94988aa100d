"""The runtime's timing budget: every wait, grace and period, each with its reason, in one
place, as several interlock (tests/test_timing.py checks how); and `poll`, the one wait for what
another process writes or says."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

_T = TypeVar("_T")

# --- SLURM's, not ours: the bound a stop works inside ---

# SLURM's default KillWait: SIGKILL this long after the SIGTERM that stops a job or step.
SLURM_KILL_WAIT_SECONDS = 30.0
# slurmctld can be slow when busy; a command (squeue, scontrol) taking longer is given up on.
SLURM_COMMAND_SECONDS = 60.0

# --- A stop (supervision/supervise.py, local_cluster.py, backends/estimator/barriers.py) ---

# How long a command told to stop may take to finish its stop (a checkpoint) while its peers
# go quiet, before it is killed as for a lost peer: inside KillWait.
STOP_GRACE_SECONDS = 20.0
# How long an Estimator chief told to stop waits for the workers to stop before it
# checkpoints anyway: with its checkpoint, inside STOP_GRACE_SECONDS.
PREEMPT_WAIT_SECONDS = 15.0
# What a stop leaves for the checkpoint after PREEMPT_WAIT_SECONDS.
CHECKPOINT_ALLOWANCE_SECONDS = 5.0
# A ps that exits the instant the last stop token arrives can catch a trainer still closing the
# session that sent it, which then retries for seconds.
PS_EXIT_GRACE_SECONDS = 1.0
# How long a parameter server's command has to end on SIGTERM once every trainer finished.
END_GRACE_SECONDS = 5.0
# A local cluster told to stop gives its tasks this long before it kills them: time for the
# chief's stop and checkpoint, inside KillWait should the launcher run in a job.
LOCAL_STOP_GRACE_SECONDS = 25.0
# A local cluster whose task failed gives the others this long to end on SIGTERM.
LOCAL_FAILED_GRACE_SECONDS = 5.0
# How long a failing Keras 3 chief waits for the others to end: a process stuck in a
# collective with it would wait for it forever.
FAILING_SECONDS = 5.0

# --- A peer's liveness (process/supervision/watchdog.py, supervise.py) ---

# Each peer is probed at most every PROBE_SECONDS, and a watcher makes at most
# PROBES_PER_SECOND probes, so that a ps watched by thousands of trainers is not flooded.
PROBE_SECONDS = 1.0
PROBES_PER_SECOND = 50.0
CONNECT_TIMEOUT_SECONDS = 1.0
READ_TIMEOUT_SECONDS = 0.25
# A peer is lost after refusing or timing out for this long in a row: refusals come only from
# a closed port, but a dropped packet takes several probes to ride out.
LOST_AFTER_SECONDS = 3.0
# A snap check probes a peer twice this far apart: a port that refuses both times is closed.
SNAP_RECHECK_SECONDS = 0.2
# How long a peer yet to answer may take to start (imports from a shared file system are slow).
START_SECONDS = 600.0
# How long a task saying it finished (or keeping JAX's service up) waits for peers to leave.
GONE_SECONDS = 60.0
# How long a finished trainer says so to parameter servers never heard from: a probe, a margin.
UNSEEN_SECONDS = 1.5 * PROBE_SECONDS
# How long a task waits, once a peer said its command failed, for its own to fail of the same
# cause, so that its log names the right culprit.
OWN_FAILURE_SECONDS = 2.0
# How often a task told to stop looks for the run's failure record (a stat).
FAILURE_POLL_SECONDS = 0.25

# --- A trainer that makes no step (process/task/hang_watch.py) ---

HANG_CHECK_SECONDS = 1.0
# How long a hung task waits for the accounts of peers found hung at about the same time
# before it names the one whose last step is oldest (itself, where none came).
HANG_ACCOUNTS_SECONDS = 10.0

# --- The run's lock (process/records/claim.py) ---

# The holder renews its lock this often while it trains...
RENEW_SECONDS = 10.0
# ...and one not renewed for this long is taken over: several renewals missed, not one slow write.
STALE_SECONDS = 90.0
# After taking over a lock, how long to wait before reading it back: of two runs that replaced
# the same stale lock, the one whose lock is still there holds it.
SETTLE_SECONDS = 0.5
# squeue, asked at a start whether a lock's job still runs, is given this long.
SQUEUE_SECONDS = 10.0

# --- The job's time limit (process/job/preemption.py) ---

# squeue is asked for the time left this often, as scontrol update TimeLimit= moves it.
LIMIT_POLL_SECONDS = 60.0
# The first wait to ask squeue again after a failure, doubled each time up to LIMIT_POLL_SECONDS.
LIMIT_RETRY_SECONDS = 5.0
# squeue is asked once more this long before the stop: a limit raised late moves it.
FINAL_LOOK_SECONDS = 15.0
# How often the stop's time is looked at again: a checkpoint may have made the margin larger.
LIMIT_LOOK_SECONDS = 5.0
# A limit that moved by less than this did not move: squeue's own rounding.
LIMIT_MOVED_SECONDS = 5.0

# --- A node that left a --no-kill job (process/job/restarts.py) ---

# How often the batch script's srun wrapper asks scontrol for the job's nodes once a task
# ended (only the job's record says a --no-kill job's node is gone)...
NODE_WATCH_SECONDS = 2.0
# ...for this long (Slurm declares a node down after SlurmdTimeout, 300 s by default, and a
# ping round), then every NODE_WATCH_SELDOM_SECONDS while the step's other tasks go on.
NODE_WATCH_OFTEN_SECONDS = 600.0
NODE_WATCH_SELDOM_SECONDS = 60.0

# --- Reports and evaluation (process/records/reports.py, backends) ---

# How long the chief waits for the other trainers' throughput reports for summary.json.
REPORT_WAIT_SECONDS = 30.0
# How long the chief waits for the evaluator's metrics: it may be busy with an older checkpoint.
EVALUATOR_WAIT_SECONDS = 600.0
# The coordinator's final evaluation is given this long: a hang would hold the run for ever.
EVALUATE_SECONDS = 3600.0
# How long an evaluator's checkpoint iterator waits before asking whether to stop: it looks
# every second, and a timeout under two looks makes it return at once, over and over.
CHECKPOINT_LOOK_SECONDS = 2.0

# --- Small waits ---

# A condition polled in a loop (a file, a queue's count).
POLL_SECONDS = 0.1
# How long the end of a command's output is waited for once it has exited.
OUTPUT_FINISH_SECONDS = 5.0


def poll(
    read: Callable[[], _T],
    done: Callable[[_T], bool],
    seconds: float,
    every: float = POLL_SECONDS,
) -> _T:
    """Reads every `every` seconds until `done` holds or `seconds` pass; the last value read."""
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if done(value) or time.monotonic() >= deadline:
            return value
        time.sleep(every)

"""The timing budget's relations (process/timing.py): the numbers that must fit inside one
another do. No TensorFlow, no SLURM."""

from __future__ import annotations

from tfconfig_slurm.process import timing


def test_every_stop_finishes_inside_slurm_s_kill_wait() -> None:
    """After SIGTERM SLURM kills the step KillWait later: a stop's waits, and the checkpoint
    they leave room for, come first."""
    assert timing.STOP_GRACE_SECONDS < timing.SLURM_KILL_WAIT_SECONDS
    assert timing.LOCAL_STOP_GRACE_SECONDS < timing.SLURM_KILL_WAIT_SECONDS
    # The Estimator chief waits for its workers, then checkpoints, before its supervisor's
    # grace runs out.
    assert (
        timing.PREEMPT_WAIT_SECONDS + timing.CHECKPOINT_ALLOWANCE_SECONDS
        <= timing.STOP_GRACE_SECONDS
    )
    assert timing.LOCAL_FAILED_GRACE_SECONDS <= timing.LOCAL_STOP_GRACE_SECONDS


def test_a_lost_peer_is_told_from_a_dropped_packet() -> None:
    """Lost only after several probes in a row went unanswered, each given its timeouts."""
    probe = timing.CONNECT_TIMEOUT_SECONDS + timing.READ_TIMEOUT_SECONDS
    assert timing.LOST_AFTER_SECONDS >= 2 * timing.PROBE_SECONDS
    assert probe < timing.LOST_AFTER_SECONDS
    assert timing.SNAP_RECHECK_SECONDS < timing.PROBE_SECONDS
    # A finished trainer is seen saying so by every watcher's next probe.
    assert timing.UNSEEN_SECONDS > timing.PROBE_SECONDS
    # A peer's start outlasts its imports; leaving takes less than starting.
    assert timing.GONE_SECONDS < timing.START_SECONDS


def test_a_held_lock_is_never_stale() -> None:
    """A lock is taken over only after several renewals were missed."""
    assert timing.STALE_SECONDS >= 5 * timing.RENEW_SECONDS
    assert timing.SETTLE_SECONDS < timing.RENEW_SECONDS


def test_the_time_limit_is_looked_at_again_before_the_stop() -> None:
    assert timing.LIMIT_RETRY_SECONDS < timing.LIMIT_POLL_SECONDS
    assert timing.FINAL_LOOK_SECONDS < timing.LIMIT_POLL_SECONDS
    assert timing.LIMIT_LOOK_SECONDS < timing.FINAL_LOOK_SECONDS

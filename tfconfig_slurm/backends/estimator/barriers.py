"""The Estimator cluster's barriers: a start barrier for workers, and a stop barrier for the ps.

The Estimator's own ps calls `server.join()` and never returns. Here each ps owns a FIFOQueue
(found by its shared name); every trainer puts a token on every ps once its training has
ended, and a ps exits once it holds one from every trainer. At start, workers wait for a token
the chief puts on the first ps once its session has initialised the variables: else a worker
that comes first finds the model "not ready" and its session manager sleeps 30 s. Told to
stop, each worker says so on a third queue on the first ps, and the chief stops last, so that
its final checkpoint holds every step taken. A dead peer ends no wait: the watchdog
(process/supervision/watchdog.py) ends the waiting process.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import tensorflow as tf
from absl import logging

from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import preemption

OnToken = Callable[[int], None]

# The graph collection of ops a trainer runs as it stops, before it says so: they let a peer
# blocked in a step that this trainer will not join (--sync_replicas, sync.py) end that step.
RELEASE_PEERS = "tfconfig_slurm_release_peers"


def _ps_device(index: int) -> str:
    return f"/job:ps/task:{index}"


def _queue(name: str, ps_index: int, capacity: int) -> tf.queue.FIFOQueue:
    # The same name, device and capacity in every process: all open the one resource on the ps.
    with tf.device(_ps_device(ps_index)):
        return tf.queue.FIFOQueue(capacity, [tf.int32], shapes=[[]], shared_name=name, name=name)


def _stop_queue(ps_index: int, trainers: int) -> tf.queue.FIFOQueue:
    return _queue(f"tfconfig_slurm_stop_ps{ps_index}", ps_index, trainers)


def _start_queue(trainers: int) -> tf.queue.FIFOQueue:
    return _queue("tfconfig_slurm_start", 0, trainers)


def _drain(
    target: str,
    ps_index: int,
    queue: tf.queue.FIFOQueue,
    count: int,
    on_token: OnToken = lambda token: None,
) -> list[int]:
    """Takes `count` tokens from a queue on ps `ps_index`, calling on_token with each. It
    dequeues only what the queue holds: nothing could interrupt a blocked dequeue."""
    available = tf.compat.v1.placeholder(tf.int32, [])
    size, take = queue.size(), queue.dequeue_many(available)
    config = tf.compat.v1.ConfigProto(device_filters=[_ps_device(ps_index)])
    tokens: list[int] = []
    with tf.compat.v1.Session(target, config=config) as session:
        while len(tokens) < count:
            ready = min(int(session.run(size)), count - len(tokens))
            if not ready:
                time.sleep(timing.POLL_SECONDS)
                continue
            for token in session.run(take, {available: ready}):
                tokens.append(int(token))
                on_token(int(token))
    return tokens


def serve_until_trainers_finish(
    server: Any, ps_index: int, trainers: int, on_token: OnToken
) -> list[int]:
    """Serves variables until every trainer has said it is done; returns who did, in order.
    on_token hears of each as it comes, so that a trainer that finished is not taken for dead."""
    with tf.Graph().as_default():
        finished = _drain(
            server.target, ps_index, _stop_queue(ps_index, trainers), trainers, on_token
        )
    logging.info(
        "ps %d: %d of %d trainers finished (%s)",
        ps_index,
        len(finished),
        trainers,
        ", ".join(map(str, finished)),
    )
    time.sleep(timing.PS_EXIT_GRACE_SECONDS)
    return finished


def send_stop_tokens(target: str, ps_count: int, trainers: int, trainer_id: int) -> None:
    """Tells every ps that this trainer is done: trained to the end, had nothing left, or failed."""
    with tf.Graph().as_default():
        enqueue = tf.group(
            *(_stop_queue(index, trainers).enqueue(trainer_id) for index in range(ps_count))
        )
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
        with tf.compat.v1.Session(target, config=config) as session:
            session.run(enqueue)


class StartBarrierHook(tf.compat.v1.train.SessionRunHook):
    """A trainer's part in the start barrier: the chief lets each worker start once its session
    has initialised the variables; a worker waits in `begin()`, before its session is made, so
    that the session finds the model ready at once."""

    def __init__(self, target: str, trainers: int, trainer_id: int) -> None:
        self._target = target
        self._trainers = trainers
        self._trainer_id = trainer_id

    def begin(self) -> None:
        workers = self._trainers - 1
        is_chief = self._trainer_id == 0
        self._start = (
            _start_queue(self._trainers).enqueue_many([[0] * workers])
            if is_chief and workers
            else None
        )
        if not is_chief:
            with tf.Graph().as_default():
                _drain(self._target, 0, _start_queue(self._trainers), 1)

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._start is not None:
            session.run(self._start)


class LeaveSessionOpenHook(tf.compat.v1.train.SessionRunHook):
    """Leaves the training session open when training ends: closing a distributed session
    while its ps is up can block for many seconds (../shared/reference/ESTIMATOR_FACTS.md), and
    nothing needs it closed: the ps drops it as it exits."""

    def after_create_session(self, session: Any, coord: Any) -> None:
        # MonitoredSession closes this very object last; only this instance is changed.
        session.close = lambda: None


class PreemptionHook(tf.compat.v1.train.SessionRunHook):
    """Stops this trainer at the first step boundary after a stop request, once it has run the
    RELEASE_PEERS ops. In a cluster each worker says so on a queue on the first ps, and the
    chief stops once every worker has (or timing.PREEMPT_WAIT_SECONDS passed): the final
    checkpoint, written as the chief stops, then holds every step any trainer took."""

    def __init__(self, stop: preemption.StopRequest, trainers: int, trainer_id: int) -> None:
        self._stop = stop
        self._trainers = trainers
        self._trainer_id = trainer_id
        self._done = False

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()
        self._release = tf.compat.v1.get_collection(RELEASE_PEERS)
        self._say_stopped = self._count_stopped = None
        if self._trainers > 1:
            queue = _queue("tfconfig_slurm_stopped", 0, self._trainers)
            if self._trainer_id == 0:
                self._count_stopped = queue.size()
            else:
                self._say_stopped = queue.enqueue(self._trainer_id)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._done or not self._stop.requested:
            return
        self._done = True
        session = run_context.session
        if self._release:
            session.run(self._release)
        if self._say_stopped is not None:
            session.run(self._say_stopped)
        if self._count_stopped is not None:
            workers = self._trainers - 1
            stopped = timing.poll(
                lambda: int(session.run(self._count_stopped)),
                lambda count: count >= workers,
                timing.PREEMPT_WAIT_SECONDS,
            )
            if stopped < workers:
                logging.warning(
                    "only %d of %d workers stopped within %.0f s; checkpointing without them",
                    stopped,
                    workers,
                    timing.PREEMPT_WAIT_SECONDS,
                )
        # Unnamed: the log names the task (srun --label), and a trainer's number is no index.
        logging.info(
            "stopping on %s at global step %d",
            self._stop.signal_name,
            session.run(self._global_step),
        )
        run_context.request_stop()

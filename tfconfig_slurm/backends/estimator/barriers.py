"""The Estimator cluster's barriers: a start barrier for workers, and a stop barrier for the ps.

The Estimator's own parameter server calls `server.join()` and never returns, so a job never
ends. Here each ps owns a queue (a FIFOQueue placed on it, found by its shared name); every
trainer puts one token on every ps once its training has ended (after the chief's final
checkpoint), and a ps exits once it holds a token from every trainer. At start, workers
wait for a token the chief puts on the first ps once its session has initialised the
variables: without it a worker that comes first finds the model "not ready" and the
Estimator's session manager sleeps 30 s before it looks again. Told to stop (preemption),
each worker says it has stopped on a third queue on the first ps, and the chief stops last,
so that its final checkpoint holds every step taken.

A wait never ends by itself when a peer dies: the watchdog
(process/supervision/watchdog.py) ends the waiting process instead. A ps tells its caller of
each token as it comes, so that a trainer that finished may leave without being taken for
dead.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import tensorflow as tf
from absl import logging

from tfconfig_slurm.process import polling, timing
from tfconfig_slurm.process.job import preemption

OnToken = Callable[[int], None]

# The graph collection of ops a trainer runs as it stops, before it says so: they let a peer
# blocked in a step that this trainer will not join (--sync_replicas, sync.py) end that step.
RELEASE_PEERS = "tfconfig_slurm_release_peers"


def _ps_device(index: int) -> str:
    return f"/job:ps/task:{index}"


def _queue(name: str, ps_index: int, capacity: int) -> tf.queue.FIFOQueue:
    # Every process builds the queue with the same name, device and capacity, so that all of
    # them open the one resource on the ps.
    with tf.device(_ps_device(ps_index)):
        return tf.queue.FIFOQueue(capacity, [tf.int32], shapes=[[]], shared_name=name, name=name)


def _stop_queue(ps_index: int, trainers: int) -> tf.queue.FIFOQueue:
    return _queue(f"tfconfig_slurm_stop_ps{ps_index}", ps_index, trainers)


def _start_queue(trainers: int) -> tf.queue.FIFOQueue:
    return _queue("tfconfig_slurm_start", 0, trainers)


def _stopped_queue(trainers: int) -> tf.queue.FIFOQueue:
    return _queue("tfconfig_slurm_stopped", 0, trainers)


def _drain(
    target: str,
    ps_index: int,
    queue: tf.queue.FIFOQueue,
    count: int,
    on_token: OnToken = lambda token: None,
) -> list[int]:
    """Takes `count` tokens from a queue on ps `ps_index` as they arrive, calling on_token
    with each. It never blocks in a dequeue, which nothing could interrupt: it dequeues only
    what the queue holds."""
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
    """Serves variables until every trainer has said it is done; returns who did, in order."""
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


def wait_for_chief(target: str, trainers: int) -> None:
    """A worker's start: returns once the chief has initialised the model's variables."""
    with tf.Graph().as_default():
        _drain(target, 0, _start_queue(trainers), 1)


def send_stop_tokens(target: str, ps_count: int, trainers: int, trainer_id: int) -> None:
    """Tells every ps that this trainer is done, from a session of its own, once its training
    has ended: whether it trained to the end, had nothing to train, or failed."""
    with tf.Graph().as_default():
        enqueue = tf.group(
            *(_stop_queue(index, trainers).enqueue(trainer_id) for index in range(ps_count))
        )
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
        with tf.compat.v1.Session(target, config=config) as session:
            session.run(enqueue)


class StartBarrierHook(tf.compat.v1.train.SessionRunHook):
    """A trainer's part in the start barrier, inside its training session.

    On the chief, once the session has initialised the variables, it lets each worker start.
    A worker waits for that in `begin()`: its graph is built by then, and its session not yet
    created, so the session finds the model ready at once.
    """

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
            wait_for_chief(self._target, self._trainers)

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._start is not None:
            session.run(self._start)


class LeaveSessionOpenHook(tf.compat.v1.train.SessionRunHook):
    """Leaves the training session open when training ends, after every hook's end() (the
    chief's final checkpoint included).

    Closing a distributed session while its ps is up blocked 2-8 s in one run of two here
    (9-40 s in ../shared/reference/ESTIMATOR_FACTS.md), and nothing needs it closed: the
    trainer then hands the ps its tokens and exits, and the ps drops the session as it exits.
    """

    def after_create_session(self, session: Any, coord: Any) -> None:
        # MonitoredSession closes this very object last; only this instance is changed.
        session.close = lambda: None


class PreemptionHook(tf.compat.v1.train.SessionRunHook):
    """Stops this trainer at the first step boundary after a stop request.

    It first runs the RELEASE_PEERS ops. In a cluster each worker then says so on a queue on
    the first ps, and the chief stops only once every worker has (or timing.PREEMPT_WAIT_SECONDS
    passed): the final checkpoint, which Estimator writes as the chief stops, then holds every
    step any trainer took.
    """

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
            queue = _stopped_queue(self._trainers)
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
            stopped = polling.poll(
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
        # Unnamed, as the Keras backend's line: the task's name is the log's (srun --label,
        # a local cluster's prefix), and a trainer's number is not its role's index.
        logging.info(
            "stopping on %s at global step %d",
            self._stop.signal_name,
            session.run(self._global_step),
        )
        run_context.request_stop()

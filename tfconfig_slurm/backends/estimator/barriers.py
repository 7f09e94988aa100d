"""The Estimator cluster's barriers: a start barrier for workers, a stop barrier for the ps,
and --sync_replicas' synchronous steps.

The Estimator's own ps calls `server.join()` and never returns. Here each ps owns a FIFOQueue
(found by its shared name); every trainer puts a token on every ps once its training has
ended, and a ps exits once it holds one from every trainer. At start, workers wait for a token
the chief puts on the first ps once its session has initialised the variables: else a worker
that comes first finds the model "not ready" and its session manager sleeps 30 s. Told to
stop, each worker says so on a third queue on the first ps, and the chief stops last, so that
its final checkpoint holds every step taken. A dead peer ends no wait: the watchdog
(process/supervision/watchdog.py) ends the waiting process.

--sync_replicas (synchronous_model_fn): synchronous updates through SyncReplicasOptimizer, the
experiment unaware. While the experiment's model_fn builds its training graph, any
tf.compat.v1.train optimizer's apply_gradients goes through a SyncReplicasOptimizer around it,
one gradient per replica each step. No tokens are queued at start, so the chief cannot run
ahead while the workers start. At the end the chief's queue runner waits for gradients that
never come, and the session's close waits 120 s for it (stop_grace_period_secs, which
Estimator does not expose): the chief's last hook stops it after every other hook's end(). A
stopping trainer first queues a token for each peer (RELEASE_PEERS), so that a peer already
inside the next step, its gradient sent, ends that step without an update and sees its stop.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable

import tensorflow as tf
from absl import logging

from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import preemption

OnToken = Callable[[int], None]
ModelFn = Callable[..., Any]

# The graph collection of ops a trainer runs as it stops, before it says so: they let a peer
# blocked in a step that this trainer will not join (--sync_replicas) end that step.
RELEASE_PEERS = "tfconfig_slurm_release_peers"


def _queue(name: str, ps_index: int, capacity: int) -> tf.queue.FIFOQueue:
    # The same name, device and capacity in every process: all open the one resource on the ps.
    with tf.device(f"/job:ps/task:{ps_index}"):
        return tf.queue.FIFOQueue(capacity, [tf.int32], shapes=[[]], shared_name=name, name=name)


def _stop_queue(ps_index: int, trainers: int) -> tf.queue.FIFOQueue:
    return _queue(f"tfconfig_slurm_stop_ps{ps_index}", ps_index, trainers)


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
    config = tf.compat.v1.ConfigProto(device_filters=[f"/job:ps/task:{ps_index}"])
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
        start = functools.partial(_queue, "tfconfig_slurm_start", 0, self._trainers)
        self._start = start().enqueue_many([[0] * workers]) if is_chief and workers else None
        if not is_chief:
            with tf.Graph().as_default():
                _drain(self._target, 0, start(), 1)

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


_building = threading.local()


@contextlib.contextmanager
def _synchronised(replicas: int) -> Iterator[list[Any]]:
    """Within the block, optimizers apply gradients synchronously; yields the wrappers made."""
    made: list[Any] = []
    optimizer_class = tf.compat.v1.train.Optimizer
    original = optimizer_class.apply_gradients

    def apply_gradients(
        self: Any, grads_and_vars: Any, global_step: Any = None, name: Any = None
    ) -> Any:
        # SyncReplicasOptimizer calls its inner optimizer's apply_gradients: that one is real.
        if getattr(_building, "inside", False):
            return original(self, grads_and_vars, global_step, name)
        synchronous = tf.compat.v1.train.SyncReplicasOptimizer(
            self, replicas_to_aggregate=replicas, total_num_replicas=replicas
        )
        made.append(synchronous)
        _building.inside = True
        try:
            return synchronous.apply_gradients(grads_and_vars, global_step, name)
        finally:
            _building.inside = False

    optimizer_class.apply_gradients = apply_gradients
    try:
        yield made
    finally:
        optimizer_class.apply_gradients = original


def synchronous_model_fn(model_fn: ModelFn, replicas: int, is_chief: bool) -> ModelFn:
    """The experiment's model_fn, training synchronously across `replicas` trainers."""

    # Estimator passes `config` only to a model_fn that names it; so does this wrapper.
    extra = ("config",) if "config" in inspect.signature(model_fn).parameters else ()

    def wrapped(features: Any, labels: Any, mode: str, params: Any, config: Any) -> Any:
        given = dict(zip(extra, (config,)))
        if mode != tf.estimator.ModeKeys.TRAIN:
            return model_fn(features, labels, mode, params, **given)
        with _synchronised(replicas) as made:
            spec = model_fn(features, labels, mode, params, **given)
        if len(made) != 1:
            raise UsageError(
                "--sync_replicas",
                f"found {len(made)} tf.compat.v1.train optimizers applying gradients in the "
                "experiment's model_fn, not one",
                "train with one tf.compat.v1.train optimizer (e.g. AdamOptimizer.minimize), "
                "or leave --sync_replicas out",
            )
        hooks = [made[0].make_session_run_hook(is_chief, num_tokens=0)]
        tf.compat.v1.add_to_collection(RELEASE_PEERS, made[0].get_init_tokens_op(replicas - 1))
        if is_chief:
            hooks.append(_CloseAtEndHook())
        return spec._replace(training_hooks=(*spec.training_hooks, *hooks))

    return wrapped


class _CloseAtEndHook(tf.compat.v1.train.SessionRunHook):
    """The chief's last hook: ends the queue runner's wait so the session closes at once."""

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._coordinator = coord

    def end(self, session: Any) -> None:
        # Stop first, so that the queue runner's error from the closed session is taken for
        # the stop it is, not reported as a failure.
        self._coordinator.request_stop()
        session.close()

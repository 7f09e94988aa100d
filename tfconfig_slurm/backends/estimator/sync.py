"""--sync_replicas: synchronous updates through SyncReplicasOptimizer, the experiment unaware.

While the experiment's model_fn builds its training graph, any tf.compat.v1.train optimizer's
apply_gradients goes through a SyncReplicasOptimizer around it, one gradient per replica each
step. No tokens are queued at start, so the chief cannot run ahead while the workers start.
At the end the chief's queue runner waits for gradients that never come, and the session's
close waits 120 s for it (stop_grace_period_secs, which Estimator does not expose): the
chief's last hook stops it after every other hook's end(). A stopping trainer first queues a
token for each peer (barriers.RELEASE_PEERS), so that a peer already inside the next step,
its gradient sent, ends that step without an update and sees its stop.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any, Callable

import tensorflow as tf

from tfconfig_slurm.backends.estimator import barriers
from tfconfig_slurm.errors import UsageError

ModelFn = Callable[..., Any]

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
        tf.compat.v1.add_to_collection(
            barriers.RELEASE_PEERS, made[0].get_init_tokens_op(replicas - 1)
        )
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

"""A user's Estimator, remade for one task of the cluster or for this process alone: RunConfig
reads TF_CONFIG once, when made, so one built in a user's script before the runtime knew the
task describes no cluster (or another). The new one keeps the user's model_fn, params, warm
start and RunConfig settings; the cluster decides only the cluster, task and device filters."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow as tf


def for_task(
    user: tf.estimator.Estimator,
    tf_config: Mapping[str, Any] | None,
    session_config: tf.compat.v1.ConfigProto | None = None,
) -> tf.estimator.Estimator:
    """`user`'s Estimator under `tf_config` (None: this process alone), with `session_config`
    in place of its own when given."""
    config = user.config
    settings = {
        "model_dir": config.model_dir,
        "tf_random_seed": config.tf_random_seed,
        "save_summary_steps": config.save_summary_steps,
        "save_checkpoints_steps": config.save_checkpoints_steps,
        "save_checkpoints_secs": config.save_checkpoints_secs,
        "session_config": session_config or config.session_config,
        "keep_checkpoint_max": config.keep_checkpoint_max,
        "keep_checkpoint_every_n_hours": config.keep_checkpoint_every_n_hours,
        "log_step_count_steps": config.log_step_count_steps,
        "train_distribute": config.train_distribute,
        "device_fn": config.device_fn,
        "protocol": config.protocol,
        "eval_distribute": config.eval_distribute,
        "session_creation_timeout_secs": config.session_creation_timeout_secs,
        "checkpoint_save_graph_def": config.checkpoint_save_graph_def,
        # Workers wait for the chief at the start barrier instead of sleeping 5 s x index.
        "experimental_max_worker_delay_secs": 0,
    }
    with tf_config_environment(tf_config):
        run_config = tf.estimator.RunConfig(**settings)
    bound = user.model_fn

    def model_fn(features: Any, labels: Any, mode: str, params: Any, config: Any) -> Any:
        # The user's params are bound to model_fn; the new Estimator gets them for its input_fns.
        del params
        return bound(features, labels, mode, config)

    return tf.estimator.Estimator(
        model_fn=model_fn,
        config=run_config,
        params=user.params,
        warm_start_from=user._warm_start_settings,
    )


@contextlib.contextmanager
def tf_config_environment(tf_config: Mapping[str, Any] | None) -> Iterator[None]:
    """TF_CONFIG as RunConfig and train_and_evaluate read it, for the duration of the block."""
    saved = os.environ.get("TF_CONFIG")
    if tf_config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = saved

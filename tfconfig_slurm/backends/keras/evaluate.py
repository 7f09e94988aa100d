"""A Keras experiment's latest checkpoint evaluated in a process of its own, outside any
cluster, for the coordinator of a ParameterServerStrategy cluster (coordinator.py): a model
of the coordinator's own runs its functions as the cluster's, and its evaluation failed or
hung here (CancelledError: RemoteExecuteNode::RunAsync).

  python -m tfconfig_slurm.backends.keras.evaluate EXPERIMENT MODEL_DIR PARAMS_JSON [EVAL_STEPS]

prints the metrics as one line of JSON.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    spec, model_dir, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else None
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf  # noqa: PLC0415

    from tfconfig_slurm.backends.keras.backend import (  # noqa: PLC0415
        built_model,
        eval_batches,
        evaluate_checkpoint,
    )
    from tfconfig_slurm.process.user_code import experiment as experiment_lib  # noqa: PLC0415

    experiment = experiment_lib.load_keras(spec)
    metrics = evaluate_checkpoint(
        built_model(experiment, params),
        tf.train.latest_checkpoint(model_dir),
        eval_batches(experiment, params),
        steps,
    )
    sys.stdout.write(json.dumps(metrics) + "\n")


if __name__ == "__main__":
    main()

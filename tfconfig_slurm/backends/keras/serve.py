"""A ParameterServerStrategy cluster's parameter server or worker: the gRPC server of the task
its TF_CONFIG names, with the runtime's thread pools (cluster/role.py; 0: TensorFlow's own),
serving until its supervisor ends it (a started server cannot be stopped).

  python -m tfconfig_slurm.backends.keras.serve INTRA_OP_THREADS INTER_OP_THREADS
"""

from __future__ import annotations

import os
import signal
import sys

from tfconfig_slurm.process.task import native_noise


def main() -> None:
    # A warning before the time limit (or a preemption) is the coordinator's to act on; by
    # default it would end this server, which the coordinator cannot go on without.
    for warning in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(warning, signal.SIG_IGN)
    # TensorFlow's start-up notes held back, as in the runtime's other tasks.
    with native_noise.start_up_notes_held(bool(os.environ.get("CUDA_VISIBLE_DEVICES"))):
        import tensorflow as tf  # noqa: PLC0415

        from tfconfig_slurm.backends import tf_process  # noqa: PLC0415

        intra_op, inter_op = (int(count) for count in sys.argv[1:3])
        tf_process.hold_threads(intra_op, inter_op)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=intra_op, inter_op_parallelism_threads=inter_op
            ),
            start=True,
        )
    server.join()


if __name__ == "__main__":
    main()

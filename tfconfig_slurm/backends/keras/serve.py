"""A ParameterServerStrategy cluster's parameter server or worker, for the runtime: the gRPC
server of the task its TF_CONFIG names, serving the coordinator until its supervisor ends it
(a started server cannot be stopped, and join() never returns; process/supervise.py).

  python -m tfconfig_slurm.backends.keras.serve
"""

from __future__ import annotations

import signal

import tensorflow as tf


def main() -> None:
    # A job's warning before its time limit (or a preemption's) is the coordinator's to act
    # on; its default action would end the server, which the coordinator cannot go on
    # without.
    for warning in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(warning, signal.SIG_IGN)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    server.join()


if __name__ == "__main__":
    main()

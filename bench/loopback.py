"""How close a parameter-server step of mnist_deep's size comes to the network's bound, on
this machine's loopback: the data path `tfconfig-slurm --explain --model_bytes` estimates.

In one run: loopback TCP's bandwidth (one stream, 2 GiB, one way), and a step that reads a
variable of mnist_deep's dense size (3.3 M float32, 13.2 MB) from a parameter server in another
process and sends it an update of the same size, as a trainer's step does, with no model
around it. Printed: the step's median, the bound its 2 x 13.2 MB set at the measured bandwidth
(one way after the other, and both at once), and the ratios.

  .venv/bin/python bench/loopback.py [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

PARAMETERS = 3_300_000
BYTES = PARAMETERS * 4
STREAM_BYTES = 2 * 1024**3
PS_SERVER = """
import sys
import tensorflow as tf
cluster = tf.train.ClusterSpec({"ps": [sys.argv[1]], "worker": [sys.argv[2]]})
tf.distribute.Server(cluster, job_name="ps", task_index=0).join()
"""


def loopback_bytes_per_second() -> float:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def sink() -> None:
        connection, _ = listener.accept()
        view, got = memoryview(bytearray(4 << 20)), 0
        while got < STREAM_BYTES and (count := connection.recv_into(view)):
            got += count
        connection.close()

    reader = threading.Thread(target=sink)
    reader.start()
    chunk = bytes(4 << 20)
    sender = socket.create_connection(("127.0.0.1", port))
    started = time.perf_counter()
    for _ in range(STREAM_BYTES // len(chunk)):
        sender.sendall(chunk)
    sender.close()
    reader.join()
    return STREAM_BYTES / (time.perf_counter() - started)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ps_step_seconds(steps: int) -> list[float]:
    import tensorflow as tf  # noqa: PLC0415  (only this half needs TensorFlow)

    ps, worker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-c", PS_SERVER, ps, worker],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""},
    )
    try:
        cluster = tf.train.ClusterSpec({"ps": [ps], "worker": [worker]})
        own = tf.distribute.Server(cluster, job_name="worker", task_index=0)
        graph = tf.Graph()
        with graph.as_default():
            with tf.device("/job:ps/task:0"):
                variable = tf.compat.v1.get_variable(
                    "dense", [PARAMETERS], initializer=tf.compat.v1.zeros_initializer()
                )
            with tf.device("/job:worker/task:0"):
                # Read it here (13.2 MB in), and send back an update of its size (13.2 MB out).
                update = tf.identity(variable) * 0.5 + 1.0
            with tf.device("/job:ps/task:0"):
                step = variable.assign_add(update).op
            with tf.compat.v1.Session(own.target, graph=graph) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                for _ in range(10):
                    session.run(step)
                times = []
                for _ in range(steps):
                    started = time.perf_counter()
                    session.run(step)
                    times.append(time.perf_counter() - started)
        return times
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    arguments = parser.parse_args()
    bandwidth = statistics.median(loopback_bytes_per_second() for _ in range(3))
    step = statistics.median(ps_step_seconds(arguments.steps))
    one_way, both_ways = BYTES / bandwidth, 2 * BYTES / bandwidth
    print(f"loopback: {bandwidth / 1e9:.2f} GB/s one stream ({bandwidth * 8 / 1e9:.1f} Gbit/s)")
    print(f"ps step of {BYTES / 1e6:.1f} MB each way: median {step * 1e3:.2f} ms")
    for name, bound in (("both ways at once", one_way), ("one way after the other", both_ways)):
        print(f"  bound, {name}: {bound * 1e3:.2f} ms (the step is {step / bound:.2f}x it)")


if __name__ == "__main__":
    main()

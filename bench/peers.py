"""The runtime against the stock job, side by side in one run: `python -m tfconfig_slurm.run`
and a stock `tf.estimator.train_and_evaluate` script with a hand-made TF_CONFIG (below), both
training mnist_deep's model_fn and input_fn with the same params (batch 64), the same
checkpoint and summary intervals and TensorFlow's default threads, in three layouts on this
machine: one process; 1 trainer + 1 ps; 2 trainers + 1 ps (ours as --local_cluster, the stock
job as processes this script starts, its ps killed once the chief has exited: a stock ps never
returns from server.join()).

Steady-state examples/s of a layout is 64 x (LONG - SHORT) / (t_LONG - t_SHORT), from the
medians of the whole runs' wall times (start to the chief's exit), so that starting, the final
checkpoint and evaluation, which both runs share, cancel; runs alternate ours and stock.
Printed: each layout's examples/s and the ratio ours / stock.

  .venv/bin/python bench/peers.py [--runs 3] [--short 100] [--long 500]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 64
# Past the longest run: neither side checkpoints while training, only at its end.
_CHECKPOINT_STEPS = 10**6
_SUMMARY_STEPS = 100
_BOUND_SECONDS = 900.0

STOCK = f"""
import json, os, sys
import tensorflow as tf
from tfconfig_slurm.experiments import mnist_deep

model_dir, steps = sys.argv[1], int(sys.argv[2])
task = json.loads(os.environ.get("TF_CONFIG", "{{}}")).get("task", {{}})
cluster = json.loads(os.environ.get("TF_CONFIG", "{{}}")).get("cluster", {{}})
trainers = len(cluster.get("chief", [])) + len(cluster.get("worker", [])) or 1
index = task.get("index", 0) + (1 if task.get("type") == "worker" else 0)
params = dict(mnist_deep.HPARAMS, batch_size={BATCH}, num_trainers=trainers, trainer_index=index)
estimator = tf.estimator.Estimator(
    model_fn=mnist_deep.model_fn,
    params=params,
    config=tf.estimator.RunConfig(
        model_dir=model_dir,
        save_checkpoints_steps={_CHECKPOINT_STEPS},
        save_summary_steps={_SUMMARY_STEPS},
        log_step_count_steps={_SUMMARY_STEPS},
    ),
)
tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(mnist_deep.input_fn, max_steps=steps),
    tf.estimator.EvalSpec(mnist_deep.input_fn, steps=10),
)
"""

# Each layout: (parameter servers, workers beside the chief); None: one process.
LAYOUTS = {"one process": None, "1 trainer + ps": (1, 0), "2 trainers + ps": (1, 1)}


def ours(layout: tuple[int, int] | None, steps: int, root: Path) -> float:
    command = [
        sys.executable, "-m", "tfconfig_slurm.run", "--experiment=mnist_deep",
        f"--train_steps={steps}", f"--output_root={root}", f"--batch_size={BATCH}",
        f"--save_checkpoints_steps={_CHECKPOINT_STEPS}", f"--log_every_steps={_SUMMARY_STEPS}",
        "--eval_steps=10",
    ]  # fmt: skip
    if layout is not None:
        command.append(f"--local_cluster=ps={layout[0]},workers={layout[1]}")
    started = time.monotonic()
    subprocess.run(command, check=True, timeout=_BOUND_SECONDS, capture_output=True, env=_env())
    return time.monotonic() - started


def stock(layout: tuple[int, int] | None, steps: int, root: Path, script: Path) -> float:
    command = [sys.executable, str(script), str(root / "model"), str(steps)]
    if layout is None:
        started = time.monotonic()
        subprocess.run(command, check=True, timeout=_BOUND_SECONDS, capture_output=True, env=_env())
        return time.monotonic() - started
    servers, workers = layout
    ports = _free_ports(1 + servers + workers)
    addresses = [f"localhost:{port}" for port in ports]
    cluster = {"chief": addresses[:1], "ps": addresses[1 : 1 + servers]}
    if workers:
        cluster["worker"] = addresses[1 + servers :]
    tasks = [("chief", 0)] + [("ps", i) for i in range(servers)]
    tasks += [("worker", i) for i in range(workers)]
    started = time.monotonic()
    processes = {
        task: subprocess.Popen(
            command,
            env=_env(
                TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
                )
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for task in tasks
    }
    status = processes[("chief", 0)].wait(timeout=_BOUND_SECONDS)
    took = time.monotonic() - started
    for process in processes.values():
        if process.poll() is None:
            process.kill()
        process.wait()
    if status != 0:
        raise SystemExit(f"the stock chief failed with exit {status}")
    return took


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def _free_ports(count: int) -> list[int]:
    holders = [socket.socket() for _ in range(count)]
    for holder in holders:
        holder.bind(("127.0.0.1", 0))
    ports = [holder.getsockname()[1] for holder in holders]
    for holder in holders:
        holder.close()
    return ports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=500)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated names")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "stock_estimator.py"
        script.write_text(STOCK)
        for name in arguments.layouts.split(","):
            layout = LAYOUTS[name]
            times: dict[tuple[str, int], list[float]] = {}
            for _ in range(arguments.runs):
                for steps in (arguments.short, arguments.long):
                    for side in ("ours", "stock"):
                        root = Path(tempfile.mkdtemp(dir=scratch))
                        took = (
                            ours(layout, steps, root)
                            if side == "ours"
                            else stock(layout, steps, root, script)
                        )
                        times.setdefault((side, steps), []).append(took)
            rates = {
                side: BATCH
                * (arguments.long - arguments.short)
                / (
                    statistics.median(times[(side, arguments.long)])
                    - statistics.median(times[(side, arguments.short)])
                )
                for side in ("ours", "stock")
            }
            runs = "; ".join(
                f"{side} {steps}: " + ", ".join(f"{took:.1f}" for took in times[(side, steps)])
                for side, steps in times
            )
            print(
                f"{name}: ours {rates['ours']:.0f} examples/s, stock {rates['stock']:.0f}: "
                f"{rates['ours'] / rates['stock']:.2f}x  (seconds: {runs})",
                flush=True,
            )


if __name__ == "__main__":
    main()

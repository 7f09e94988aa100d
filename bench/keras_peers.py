"""A Keras runtime against itself at 1 and 2 processes and against the stock job, side by side
in one run on this machine, batch 64 a process, the digits fallback:

- `--flavor keras3` (run it with .venv-keras3): mnist_keras3 on JAX; the stock job is
  bench/keras3_stock.py (the same model and data, its processes joined by JAX's own SLURM
  detection from the SLURM variables of a 2-task step on localhost, which it is given);
- `--flavor tf-keras` (with .venv-tf2): mnist_keras with MultiWorkerMirroredStrategy; the
  stock job is bench/keras_stock.py (the same model and data, TensorFlow's tutorial script,
  its 2 processes given a TF_CONFIG of a chief and a worker on localhost, TensorFlow's default
  threads), the runtime as --local_cluster=workers=1 with its threads sized by the layout.

Each figure is the sum over the processes of each one's examples/s from its second step to its
last, the mean of --runs runs.

  .venv-keras3/bin/python bench/keras_peers.py --flavor keras3 [--steps 200] [--runs 2]
  .venv-tf2/bin/python bench/keras_peers.py --flavor tf-keras [--steps 200] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from runtime import free_ports, global_examples_per_sec, train

_REPOSITORY = Path(__file__).resolve().parents[1]
_BATCH = 64


class Flavor(NamedTuple):
    experiment: str
    stock: Path
    # What each of the stock job's processes, by rank, is given to find the others.
    joining: Callable[[int], list[dict[str, str]]]


def runtime(flavor: Flavor, root: Path, steps: int, *flags: str) -> float:
    ((_, summary),) = train(
        root, ["run"], f"--train_steps={steps}", f"--batch_size={_BATCH}", *flags,
        python=sys.executable, experiment=flavor.experiment,
    )  # fmt: skip
    return global_examples_per_sec(summary)


def stock(flavor: Flavor, steps: int, processes: int) -> float:
    """The stock job's examples/s, summed over its processes (started at once)."""
    joining = flavor.joining(processes)
    started = [
        subprocess.Popen(
            [sys.executable, str(flavor.stock), str(steps), str(_BATCH)],
            env={**os.environ, **joining[rank]},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_REPOSITORY,
        )
        for rank in range(processes)
    ]
    said = [process.communicate() for process in started]
    for process, (_, log) in zip(started, said):
        if process.returncode != 0:
            raise RuntimeError(f"the stock job failed:\n{log[-3000:]}")
    return float(sum(json.loads(out.splitlines()[-1])["examples_per_sec"] for out, _ in said))


def _slurm_tasks(processes: int) -> list[dict[str, str]]:
    """What JAX's SLURM detection reads, for each rank of a step on localhost; nothing for one
    process, which joins no one."""
    if processes == 1:
        return [{}]
    return [
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_NODELIST": "localhost",
            "SLURM_NTASKS": str(processes),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
        }
        for rank in range(processes)
    ]


def _tf_configs(processes: int) -> list[dict[str, str]]:
    """A chief and workers on localhost, one TF_CONFIG each; nothing for one process."""
    if processes == 1:
        return [{}]
    addresses = [f"localhost:{port}" for port in free_ports(processes)]
    cluster = {"chief": addresses[:1], "worker": addresses[1:]}
    tasks = [("chief", 0)] + [("worker", index) for index in range(processes - 1)]
    return [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})}
        for kind, index in tasks
    ]


FLAVORS = {
    "keras3": Flavor("mnist_keras3", _REPOSITORY / "bench" / "keras3_stock.py", _slurm_tasks),
    "tf-keras": Flavor("mnist_keras", _REPOSITORY / "bench" / "keras_stock.py", _tf_configs),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flavor", choices=sorted(FLAVORS), default="keras3")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    arguments = parser.parse_args()
    flavor, steps, runs = FLAVORS[arguments.flavor], arguments.steps, arguments.runs
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(runs):
            # Alternating, so that a slower minute of the machine falls on every side.
            root = Path(scratch, str(run))
            one = runtime(flavor, root / "one", steps)
            figures.setdefault("runtime, 1 process", []).append(one)
            figures.setdefault("stock, 1 process", []).append(stock(flavor, steps, 1))
            two = runtime(flavor, root / "two", steps, "--local_cluster=workers=1")
            figures.setdefault("runtime, 2 processes", []).append(two)
            figures.setdefault("stock, 2 processes", []).append(stock(flavor, steps, 2))
    mean = {name: statistics.mean(values) for name, values in figures.items()}
    print(
        f"{flavor.experiment}, {steps} steps of {_BATCH} a process, {runs} runs, "
        f"{os.cpu_count()} CPUs"
    )
    for name, values in figures.items():
        each = ", ".join(f"{value:.1f}" for value in values)
        print(f"  {name:22} {mean[name]:8.1f} examples/s  ({each})")
    for label, over, under in (
        ("runtime 2 / 1 processes", "runtime, 2 processes", "runtime, 1 process"),
        ("runtime / stock, 1 process", "runtime, 1 process", "stock, 1 process"),
        ("runtime / stock, 2 processes", "runtime, 2 processes", "stock, 2 processes"),
    ):
        print(f"  {label + ':':31} {mean[over] / mean[under]:.2f}x")


if __name__ == "__main__":
    main()

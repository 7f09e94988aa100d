"""The Keras 3 runtime (JAX) against itself at 1 and 2 processes and against the stock job
(bench/keras3_stock.py: the same model and data, its processes joined by JAX's own SLURM
detection, no runtime), side by side in one run on this machine: mnist_keras3, batch 64 a
process, the digits fallback. Each figure is the sum over the processes of each one's
examples/s from its second step to its last, the mean of --runs runs. The stock job's 2
processes are given the SLURM variables JAX reads (a 2-task step on localhost).

  .venv-keras3/bin/python bench/keras3.py [--steps 200] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from runtime import global_examples_per_sec, train

_REPOSITORY = Path(__file__).resolve().parents[1]
_STOCK = _REPOSITORY / "bench" / "keras3_stock.py"
_BATCH = 64


def runtime(root: Path, steps: int, *flags: str) -> float:
    ((_, summary),) = train(
        root, ["run"], f"--train_steps={steps}", f"--batch_size={_BATCH}", *flags,
        python=sys.executable, experiment="mnist_keras3",
    )  # fmt: skip
    return global_examples_per_sec(summary)


def stock(steps: int, processes: int) -> float:
    """The stock job's examples/s, summed over its processes (started at once)."""
    started = [
        subprocess.Popen(
            [sys.executable, str(_STOCK), str(steps), str(_BATCH)],
            env={**os.environ, **_slurm_task(rank, processes)},
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


def _slurm_task(rank: int, processes: int) -> dict[str, str]:
    """What JAX's SLURM detection reads, for rank `rank` of a step on localhost; nothing for
    one process, which joins no one."""
    if processes == 1:
        return {}
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_NTASKS": str(processes),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    steps, runs = parser.parse_args().steps, parser.parse_args().runs
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(runs):
            # Alternating, so that a slower minute of the machine falls on every side.
            root = Path(scratch, str(run))
            figures.setdefault("runtime, 1 process", []).append(runtime(root / "one", steps))
            figures.setdefault("stock, 1 process", []).append(stock(steps, 1))
            two = runtime(root / "two", steps, "--local_cluster=workers=1")
            figures.setdefault("runtime, 2 processes", []).append(two)
            figures.setdefault("stock, 2 processes", []).append(stock(steps, 2))
    mean = {name: statistics.mean(values) for name, values in figures.items()}
    print(f"mnist_keras3, {steps} steps of {_BATCH} a process, {runs} runs, {os.cpu_count()} CPUs")
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

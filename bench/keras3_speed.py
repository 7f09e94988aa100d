"""The Keras 3 runtime against the plain script a user writes (bench/keras3_plain.py), one
process, side by side in one run on this machine: mnist_keras3 on the shipped digits at batch
64 and 512, the runtime (`python -m tfconfig_slurm.run`, its summary's examples/s from its
second step to its last) beside the plain fit on arrays and on the shipped generator (their
epochs after the first), the three alternating, each --runs times. Prints each figure and the
ratios runtime / plain. On a GPU machine it runs on the GPU (docs/keras3.md says how to run it
there); with several devices, each trains data-parallel over them.

  .venv-keras3/bin/python bench/keras3_speed.py [--batches 64 512] [--runs 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Examples a second a batch size trains at, at least: the runs' lengths are sized by it.
_ROUGH_RATE = {64: 1200, 512: 2400}


def runtime(batch_size: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as root:
        subprocess.run(
            [sys.executable, "-m", "tfconfig_slurm.run", "--experiment=mnist_keras3",
             f"--output_root={root}", f"--batch_size={batch_size}", f"--train_steps={steps}",
             "--log_every_steps=100"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        summary = json.loads((Path(root) / "mnist_keras3" / "summary.json").read_text())
    return float(summary["trainers"][0]["examples_per_sec"])


def plain(batch_size: int, epochs: int, data: str) -> float:
    said = subprocess.run(
        [sys.executable, str(_HERE / "keras3_plain.py"), str(batch_size), str(epochs), data],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return float(json.loads(said.stdout.splitlines()[-1])["examples_per_sec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="each training's length, roughly, on a CPU"
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="runs this many times longer (a GPU: 30)"
    )
    arguments = parser.parse_args()
    for batch_size in arguments.batches:
        examples = arguments.seconds * _ROUGH_RATE.get(batch_size, 2400) * arguments.scale
        steps = max(int(examples / batch_size), 300)
        epochs = max(int(examples / 57520) + 1, 3)
        rates: dict[str, list[float]] = {"runtime": [], "arrays": [], "generator": []}
        for _ in range(arguments.runs):
            rates["runtime"].append(runtime(batch_size, steps))
            rates["arrays"].append(plain(batch_size, epochs, "arrays"))
            rates["generator"].append(plain(batch_size, max(steps // 100, 3), "generator"))
        means = {name: statistics.mean(each) for name, each in rates.items()}
        for name, each in rates.items():
            print(
                f"batch {batch_size}, {name}: {means[name]:.1f} examples/s "
                f"({', '.join(f'{rate:.1f}' for rate in each)})"
            )
        runtime_ = means["runtime"]
        print(
            f"batch {batch_size}: runtime / plain on arrays {runtime_ / means['arrays']:.2f}x, "
            f"runtime / plain on the generator {runtime_ / means['generator']:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()

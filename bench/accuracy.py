"""The shipped experiments' test accuracy in one process, on the digits that ship in
the package, against the floors the README and the docs state:

- mnist_deep, 600 steps with checkpoints every 200: `make run`'s training, whose accuracy the
  README gives;
- mnist_keras, 300 steps: half the 600 in which it is to reach 97%, its floor here.

Each run from scratch, in its own environment: the Estimator's from --estimator_python
(.venv), the Keras one's from --keras_python (.venv-tf2; `make test` builds both). Prints each
run's accuracy, the lowest and the floor, and exits 1 where a run fell below its floor.

  .venv/bin/python bench/accuracy.py [--runs 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from runtime import train

_REPOSITORY = Path(__file__).resolve().parents[1]
# (experiment, its environment, flags, the floor of its test accuracy)
_EXPERIMENTS = {
    "mnist_deep": ("estimator", ("--train_steps=600", "--save_checkpoints_steps=200"), 0.97),
    "mnist_keras": ("keras", ("--train_steps=300",), 0.97),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each experiment")
    parser.add_argument("--estimator_python", default=str(_REPOSITORY / ".venv" / "bin" / "python"))
    parser.add_argument("--keras_python", default=str(_REPOSITORY / ".venv-tf2" / "bin" / "python"))
    arguments = parser.parse_args()
    python = {"estimator": arguments.estimator_python, "keras": arguments.keras_python}
    below = []
    print(f"accuracy: the shipped experiments in one process, {arguments.runs} runs each")
    with tempfile.TemporaryDirectory() as scratch:
        for experiment, (environment, flags, floor) in _EXPERIMENTS.items():
            accuracies = [
                summary["eval"]["accuracy"]
                for run in range(arguments.runs)
                for _, summary in train(
                    Path(scratch),
                    [f"{experiment}-{run}"],
                    *flags,
                    python=python[environment],
                    experiment=experiment,
                )
            ]
            said = ", ".join(f"{accuracy:.4f}" for accuracy in accuracies)
            met = min(accuracies) >= floor
            print(
                f"  {experiment} ({' '.join(flags)}): {said}; lowest {min(accuracies):.4f}, "
                f"floor {floor:.2f}: {'met' if met else 'NOT MET'}"
            )
            if not met:
                below.append(experiment)
    sys.exit(1 if below else 0)


if __name__ == "__main__":
    main()

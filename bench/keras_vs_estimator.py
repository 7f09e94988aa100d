"""The Keras runtime (TensorFlow 2.16+, MultiWorkerMirroredStrategy) beside the Estimator
runtime (TensorFlow 2.15, a parameter server), measured side by side in one run on the local
cluster: mnist_keras and mnist_deep (the same convnet), batch 64, on the digits fallback.

- scaling: global examples/s of 2 trainers against 1, every process held to 1 intra-op and
  1 inter-op thread. Keras: --local_cluster=workers=1 against workers=0 (a chief alone, the
  same strategy); Estimator: ps=1,workers=1 against ps=1,workers=0. Beside each, the cores
  the machine had busy while the chief trained.
- teardown: seconds from the last trainer's last step to the last task's exit, in the
  2-trainer runs (the final checkpoint, evaluation and reports included, and the
  Estimator's export).

Each runtime runs in its own environment: the Estimator's from --estimator_python (.venv),
the Keras one's from --keras_python (.venv-tf2; `make test` builds both).

  .venv/bin/python bench/keras_vs_estimator.py [--steps 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from runtime import (
    THREADS,
    CpuMeter,
    Figures,
    busy_while_training,
    global_examples_per_sec,
    log_time,
    ratio,
    task_log,
    train,
)

_REPOSITORY = Path(__file__).resolve().parents[1]
# (experiment, the local clusters of 1 and 2 trainers)
_RUNTIMES = {
    "keras": ("mnist_keras", "workers=0", "workers=1"),
    "estimator": ("mnist_deep", "ps=1,workers=0", "ps=1,workers=1"),
}


def teardown(log: str, tasks: list[str]) -> float:
    """Seconds from the last trainer's last step to the launcher's last "finished" line."""
    trainers = [task for task in tasks if not task.startswith("ps")]
    last_step = max(log_time(task_log(log, task), "last step done") for task in trainers)
    return max(log_time(log, rf"{task} finished") for task in tasks) - last_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--estimator_python", default=str(_REPOSITORY / ".venv" / "bin" / "python"))
    parser.add_argument("--keras_python", default=str(_REPOSITORY / ".venv-tf2" / "bin" / "python"))
    arguments = parser.parse_args()
    steps = f"--train_steps={arguments.steps}"
    python = {"keras": arguments.keras_python, "estimator": arguments.estimator_python}
    figures = Figures()
    with tempfile.TemporaryDirectory() as scratch, CpuMeter() as meter:
        root = Path(scratch)
        for run in range(arguments.runs):
            for name, (experiment, one, two) in _RUNTIMES.items():
                for trainers, cluster in (("one", one), ("two", two)):
                    [(log, summary)] = train(
                        root,
                        [f"{name}-{trainers}{run}"],
                        steps,
                        *THREADS,
                        f"--local_cluster={cluster}",
                        python=python[name],
                        experiment=experiment,
                    )
                    figures.add(f"{name} {trainers}", global_examples_per_sec(summary))
                    figures.add(f"{name} {trainers} cores", busy_while_training(meter, log))
                    if trainers == "two":
                        tasks = ["chief 0", "worker 0"] + (["ps 0"] if "ps=" in cluster else [])
                        figures.add(f"{name} teardown", teardown(log, tasks))
    print(
        f"keras_vs_estimator: {arguments.steps} steps, batch 64, {arguments.runs} runs each, "
        "local cluster, 1 intra + 1 inter-op thread a process"
    )
    for name, how in (("keras", "all-reduce"), ("estimator", "through a ps")):
        ratio(figures, f"{name}: 2 trainers vs 1", f"{name} two", f"{name} one", how)
    for name in _RUNTIMES:
        print(
            f"  {name}: last step to last exit, 2 trainers  median "
            f"{figures[f'{name} teardown']:.2f} s"
        )


if __name__ == "__main__":
    main()

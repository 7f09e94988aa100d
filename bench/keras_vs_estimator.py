"""The Keras runtimes (TensorFlow 2.16+: MultiWorkerMirroredStrategy, and
ParameterServerStrategy with --coordinator) beside the Estimator runtime (TensorFlow 2.15, a
parameter server), measured side by side in one run on the local cluster: mnist_keras and
mnist_deep (the same convnet), batch 64, on the digits fallback.

- scaling: global examples/s of 2 trainers against 1, every process held to 1 intra-op and
  1 inter-op thread. Keras all-reduce: --local_cluster=workers=1 against workers=0 (a chief
  alone, the same strategy); ParameterServerStrategy: ps=1,workers=2 against ps=1,workers=1
  (the coordinator trains nothing); Estimator: ps=1,workers=1 against ps=1,workers=0. Beside
  each, the cores the machine had busy while the chief trained (or coordinated).
- teardown: seconds from the last trainer's last step (the coordinator's, with a coordinator)
  to the last task's exit, in the 2-trainer runs (the final checkpoint, evaluation and
  reports included, and the Estimator's export); with a coordinator also from the
  coordinator's exit, which ends the others.
- accuracy: the 2-trainer runs' test accuracy after --steps.

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
# (experiment, the local clusters of 1 and 2 trainers, further flags, how it trains)
_RUNTIMES = {
    "keras": ("mnist_keras", "workers=0", "workers=1", (), "all-reduce"),
    "pss": ("mnist_keras", "ps=1,workers=1", "ps=1,workers=2", ("--coordinator",), "through a ps"),
    "estimator": ("mnist_deep", "ps=1,workers=0", "ps=1,workers=1", (), "through a ps"),
}


def teardown(log: str, tasks: list[str], trainers: list[str]) -> float:
    """Seconds from the trainers' last step to the launcher's last "finished" line."""
    last_step = max(log_time(task_log(log, task), "last step done") for task in trainers)
    return last_exit(log, tasks) - last_step


def last_exit(log: str, tasks: list[str]) -> float:
    return max(log_time(log, rf"{task} finished") for task in tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--estimator_python", default=str(_REPOSITORY / ".venv" / "bin" / "python"))
    parser.add_argument("--keras_python", default=str(_REPOSITORY / ".venv-tf2" / "bin" / "python"))
    arguments = parser.parse_args()
    steps = f"--train_steps={arguments.steps}"
    python = {
        "keras": arguments.keras_python,
        "pss": arguments.keras_python,
        "estimator": arguments.estimator_python,
    }
    figures = Figures()
    with tempfile.TemporaryDirectory() as scratch, CpuMeter() as meter:
        root = Path(scratch)
        for run in range(arguments.runs):
            for name, (experiment, one, two, flags, _) in _RUNTIMES.items():
                for trainers, cluster in (("one", one), ("two", two)):
                    [(log, summary)] = train(
                        root,
                        [f"{name}-{trainers}{run}"],
                        steps,
                        *THREADS,
                        *flags,
                        f"--local_cluster={cluster}",
                        python=python[name],
                        experiment=experiment,
                    )
                    figures.add(f"{name} {trainers}", global_examples_per_sec(summary))
                    figures.add(f"{name} {trainers} cores", busy_while_training(meter, log))
                    if trainers == "two":
                        tasks = _tasks(cluster)
                        stepping = (
                            ["chief 0"] if flags else tasks[:-1] if "ps=" in cluster else tasks
                        )
                        figures.add(f"{name} teardown", teardown(log, tasks, stepping))
                        figures.add(f"{name} accuracy", summary["eval"]["accuracy"])
                        if flags:
                            coordinator_exit = log_time(
                                log, r"\(the coordinator\): its command finished"
                            )
                            figures.add("pss after", last_exit(log, tasks) - coordinator_exit)
    print(
        f"keras_vs_estimator: {arguments.steps} steps, batch 64, {arguments.runs} runs each, "
        "local cluster, 1 intra + 1 inter-op thread a process"
    )
    for name, (*_, how) in _RUNTIMES.items():
        ratio(figures, f"{name}: 2 trainers vs 1", f"{name} two", f"{name} one", how)
    for name in _RUNTIMES:
        print(
            f"  {name}: last step to last exit, 2 trainers  median "
            f"{figures[f'{name} teardown']:.2f} s; test accuracy after {arguments.steps} steps "
            f"{figures[f'{name} accuracy']:.4f}"
        )
    print(f"  pss: the coordinator's exit to the last task's  median {figures['pss after']:.2f} s")


def _tasks(cluster: str) -> list[str]:
    """A local cluster's tasks by name, the parameter servers last ("ps=1,workers=2": chief
    0, worker 0, worker 1, ps 0)."""
    counts = dict(item.split("=") for item in cluster.split(","))
    workers = [f"worker {index}" for index in range(int(counts.get("workers", 0)))]
    return ["chief 0", *workers, *[f"ps {index}" for index in range(int(counts.get("ps", 0)))]]


if __name__ == "__main__":
    main()

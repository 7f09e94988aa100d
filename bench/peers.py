"""The runtime against the stock job, side by side in one run: `python -m tfconfig_slurm.run`
and a stock `tf.estimator.train_and_evaluate` script with a hand-made TF_CONFIG (below), both
training mnist_deep's model_fn and input_fn with the same params (batch 64), the same
checkpoint and summary intervals, in four layouts on this machine: one process; 1 trainer +
1 ps; 2 trainers + 1 ps; 5 trainers + 1 ps, a node oversubscribed on purpose (ours as
--local_cluster, the stock job as processes this script starts, its ps killed once the chief
has exited: a stock ps never returns from server.join()). The stock job keeps TensorFlow's
default threads (every CPU, in every process); ours sizes each task's by its role and the
node's share of CPUs (cluster/role.py), as it does by default.

Two measures of a layout's examples/s, each side's and the ratio ours / stock; runs alternate:
- whole runs: 64 x (LONG - SHORT) / (t_LONG - t_SHORT), from the medians of the whole runs'
  wall times (start to the chief's exit), so that what both lengths share cancels, though
  an end that varies between runs does not;
- steady state: 64 x the global steps/s the chief logs every 100 steps (ours: its step lines;
  the stock job: Estimator's global_step/sec), after the first 100, in the LONG runs (median
  of the runs' means), which neither the start nor the end reaches.
The start: seconds from the chief's imports (TensorFlow and the experiment) to its first step
done, median of all its runs: ours from its first line to its "first step done", the stock
job from a line the script prints there to Estimator's "loss = ..., step = 0".
And each side's CPU time a step: the user and system seconds of all its processes (the
launcher and every task), from the difference of the LONG and SHORT runs' medians. Where the
layout keeps the machine's cores busy, examples/s can only follow CPU a step: a side that
spends as much CPU on a step as the other cannot train faster.

  .venv/bin/python bench/peers.py [--runs 3] [--short 100] [--long 500]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from runtime import free_ports

BATCH = 64
# Past the longest run: neither side checkpoints while training, only at its end.
_CHECKPOINT_STEPS = 10**6
_SUMMARY_STEPS = 100
_BOUND_SECONDS = 900.0

STOCK = f"""
import json, logging, os, sys, time
import tensorflow as tf
from tfconfig_slurm.experiments import mnist_deep

# Where ours logs its first line: TensorFlow and the experiment imported, Estimator not yet.
print(f"imported at {{time.time()}}", file=sys.stderr, flush=True)
# As a stock script does, to see Estimator's global_step/sec lines; timed, for its first step.
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
for handler in logging.getLogger("tensorflow").handlers:
    handler.setFormatter(logging.Formatter("%(created)f %(message)s"))

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
LAYOUTS = {
    "one process": None,
    "1 trainer + ps": (1, 0),
    "2 trainers + ps": (1, 1),
    "5 trainers + ps": (1, 4),
}


class Run(NamedTuple):
    seconds: float
    # User and system seconds of every process of the run (all waited for, so counted).
    cpu_seconds: float
    # The chief's seconds from its imports to its first step done.
    start: float
    # The chief's logged global steps/s after its first logged window, averaged: steady
    # state, which neither the start nor the end reaches.
    steps_per_sec: float | None


def ours(layout: tuple[int, int] | None, steps: int, root: Path) -> Run:
    command = [
        sys.executable, "-m", "tfconfig_slurm.run", "--experiment=mnist_deep",
        f"--train_steps={steps}", f"--output_root={root}", f"--batch_size={BATCH}",
        f"--save_checkpoints_steps={_CHECKPOINT_STEPS}", f"--log_every_steps={_SUMMARY_STEPS}",
        "--eval_steps=10",
    ]  # fmt: skip
    if layout is not None:
        command.append(f"--local_cluster=ps={layout[0]},workers={layout[1]}")
    started, cpu = time.monotonic(), _children_cpu()
    done = subprocess.run(
        command, check=True, timeout=_BOUND_SECONDS, capture_output=True, text=True, env=_env()
    )
    took, cpu = time.monotonic() - started, _children_cpu() - cpu
    chief = "\n".join(
        line for line in done.stderr.splitlines() if layout is None or "[chief 0]" in line
    )
    start = _clock(chief, "first step done") - _clock(chief, "starting at step 0")
    return Run(took, cpu, start, _steady(re.findall(r"([\d.]+) global steps/s", chief)))


def stock(layout: tuple[int, int] | None, steps: int, root: Path, script: Path) -> Run:
    command = [sys.executable, str(script), str(root / "model"), str(steps)]
    servers, workers = layout or (0, 0)
    ports = free_ports(1 + servers + workers)
    addresses = [f"localhost:{port}" for port in ports]
    cluster = {"chief": addresses[:1], "ps": addresses[1 : 1 + servers]}
    if workers:
        cluster["worker"] = addresses[1 + servers :]
    tasks = [("chief", 0)] + [("ps", i) for i in range(servers)]
    tasks += [("worker", i) for i in range(workers)]
    log = root / "chief.log"
    started, cpu = time.monotonic(), _children_cpu()
    with log.open("w") as chief_log:
        processes = {
            task: subprocess.Popen(
                command,
                env=_env(
                    **(
                        {}
                        if layout is None
                        else {
                            "TF_CONFIG": json.dumps(
                                {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
                            )
                        }
                    )
                ),
                stdout=subprocess.DEVNULL,
                stderr=chief_log if task == ("chief", 0) else subprocess.DEVNULL,
            )
            for task in (tasks if layout else tasks[:1])
        }
        status = processes[("chief", 0)].wait(timeout=_BOUND_SECONDS)
    took = time.monotonic() - started
    for process in processes.values():
        if process.poll() is None:
            process.kill()
        process.wait()
    cpu = _children_cpu() - cpu
    if status != 0:
        raise SystemExit(f"the stock chief failed with exit {status}:\n{log.read_text()[-2000:]}")
    text = log.read_text()
    imported = float(_found(r"imported at ([\d.]+)", text)[1])
    first = float(_found(r"([\d.]+) loss = .*, step = 0\b", text)[1])
    return Run(took, cpu, first - imported, _steady(re.findall(r"global_step/sec: ([\d.]+)", text)))


def _clock(log: str, pattern: str) -> float:
    """Seconds of the day of the first absl line matching `pattern`."""
    hours, minutes, seconds = _found(rf"I\d{{4}} (\d\d):(\d\d):([\d.]+) .*{pattern}", log).groups()
    return 3600 * int(hours) + 60 * int(minutes) + float(seconds)


def _found(pattern: str, log: str) -> re.Match[str]:
    found = re.search(pattern, log)
    if found is None:
        raise SystemExit(f"no line matches {pattern!r} in this log:\n{log[-2000:]}")
    return found


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _steady(rates: list[str]) -> float | None:
    """The mean of the logged rates after the first window (which holds the start)."""
    later = [float(rate) for rate in rates[1:]]
    return statistics.mean(later) if later else None


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


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
            runs: dict[tuple[str, int], list[Run]] = {}
            for _ in range(arguments.runs):
                for steps in (arguments.short, arguments.long):
                    for side in ("ours", "stock"):
                        root = Path(tempfile.mkdtemp(dir=scratch))
                        run = (
                            ours(layout, steps, root)
                            if side == "ours"
                            else stock(layout, steps, root, script)
                        )
                        runs.setdefault((side, steps), []).append(run)
            _report(name, runs, arguments.short, arguments.long)


def _report(name: str, runs: dict[tuple[str, int], list[Run]], short: int, long: int) -> None:
    """Both measures of a layout, each side's and their ratio, and the runs' seconds."""
    whole, steady, cpu, start = {}, {}, {}, {}
    for side in ("ours", "stock"):
        seconds = {steps: [run.seconds for run in runs[(side, steps)]] for steps in (short, long)}
        whole[side] = (
            BATCH * (long - short)
            / (statistics.median(seconds[long]) - statistics.median(seconds[short]))
        )  # fmt: skip
        used = {steps: [run.cpu_seconds for run in runs[(side, steps)]] for steps in (short, long)}
        cpu[side] = (statistics.median(used[long]) - statistics.median(used[short])) / (
            long - short
        )
        start[side] = statistics.median(
            run.start for steps in (short, long) for run in runs[(side, steps)]
        )
        logged = [run.steps_per_sec for run in runs[(side, long)] if run.steps_per_sec]
        steady[side] = BATCH * statistics.median(logged) if logged else float("nan")
    print(
        f"{name}: whole runs ours {whole['ours']:.0f} examples/s, stock {whole['stock']:.0f}: "
        f"{whole['ours'] / whole['stock']:.2f}x; steady state (logged) ours "
        f"{steady['ours']:.0f}, stock {steady['stock']:.0f}: "
        f"{steady['ours'] / steady['stock']:.2f}x; CPU a step ours {1000 * cpu['ours']:.1f} ms, "
        f"stock {1000 * cpu['stock']:.1f} ms: stock / ours {cpu['stock'] / cpu['ours']:.2f}x; "
        f"chief's first step after its imports ours {start['ours']:.2f} s, stock "
        f"{start['stock']:.2f} s",
        flush=True,
    )
    print(
        "  seconds: "
        + "; ".join(
            f"{side} {steps}: "
            + ", ".join(f"{run.seconds:.1f} ({run.cpu_seconds:.0f} CPU)" for run in measured)
            for (side, steps), measured in runs.items()
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

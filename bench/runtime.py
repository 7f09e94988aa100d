"""Runtime benchmarks, measured side by side in one run on this machine (mnist_deep, batch 64).

- teardown: seconds from the chief's last training step to the last process's exit, local
  cluster ps=1, workers=2 (the stock Estimator ps never exits). Target <= 2 s.
- scaling: global examples/s of 2 trainers against 1 (each with a ps, every process held to
  1 intra-op and 1 inter-op thread, same steps); target >= 1.6x. Beside it, what this machine
  gives two processes that share nothing: two plain processes at once against one, same
  threads. And 1 trainer + 1 ps against one plain process with the same threads; target
  >= 0.9x. For every configuration, the cores the machine had busy while the chief trained
  (sampled from /proc/stat): the thread flags do not hold every configuration to the same.
- start: seconds from a task's process start to its first step, per role, against
  `python -c "import tensorflow"` in the same run: alone, and in as many processes at once as
  the cluster starts, as its tasks import it; and the part after the task's own imports (from
  its first log line). Target <= the import + 1.5 s.

  .venv/bin/python bench/runtime.py [--steps 300] [--runs 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# absl's line prefix: I1122 02:19:56.091734 <thread> <file>:<line>] message
_LOG_TIME = r"[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d{6}) +\d+ \S+\] "
THREADS = ("--intra_op_threads=1", "--inter_op_threads=1")
# The teardown cluster: chief, ps and two workers.
_CLUSTER_TASKS = ("chief 0", "ps 0", "worker 0", "worker 1")


class CpuMeter:
    """The machine's busy and total CPU time, sampled from /proc/stat in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self._interval = interval
        self._samples: list[tuple[float, int, int]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CpuMeter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(self._interval):
            with open("/proc/stat") as stat:
                jiffies = [int(field) for field in stat.readline().split()[1:9]]
            idle = jiffies[3] + jiffies[4]  # idle and iowait
            self._samples.append((time.time(), sum(jiffies) - idle, sum(jiffies)))

    def busy_cores(self, start: float, end: float) -> float:
        """The cores busy on average between two wall times, from the samples inside."""
        inside = [sample for sample in self._samples if start <= sample[0] <= end]
        if len(inside) < 2:
            raise ValueError("too short a window to sample the CPU")
        (_, busy0, total0), (_, busy1, total1) = inside[0], inside[-1]
        return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)


def train(
    root: Path,
    names: list[str],
    *flags: str,
    python: str = sys.executable,
    experiment: str = "mnist_deep",
) -> list[tuple[str, dict[str, Any]]]:
    """Runs one training per name at once, with the same flags; each one's log and summary."""
    processes = [
        subprocess.Popen(
            [
                python,
                "-m",
                "tfconfig_slurm.run",
                f"--experiment={experiment}",
                f"--output_root={root}",
                f"--experiment_id={name}",
                "--log_every_steps=50",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    logs = [process.communicate()[1] for process in processes]
    for process, log in zip(processes, logs):
        if process.returncode != 0:
            raise RuntimeError(f"a training failed:\n{log[-3000:]}")
    return [
        (log, json.loads((root / name / "summary.json").read_text()))
        for name, log in zip(names, logs)
    ]


def log_time(log: str, pattern: str) -> float:
    """The wall time of the first log line whose message matches `pattern`."""
    match = re.search(_LOG_TIME + pattern, log)
    if match is None:
        raise ValueError(f"no log line matches {pattern!r}")
    day, clock = match.groups()
    now = datetime.datetime.now()
    stamp = datetime.datetime.strptime(f"{now.year}{day} {clock}", "%Y%m%d %H:%M:%S.%f")
    return stamp.timestamp()


def task_log(log: str, task: str) -> str:
    """The lines a local cluster's task wrote ("[chief 0] ..."), without their prefix."""
    prefix = f"[{task}] "
    return "\n".join(line[len(prefix) :] for line in log.splitlines() if line.startswith(prefix))


def chief_log(log: str) -> str:
    """The chief's own lines: a cluster's chief 0, or the one process of a plain run."""
    return task_log(log, "chief 0") or log


def busy_while_training(meter: CpuMeter, log: str) -> float:
    own = chief_log(log)
    return meter.busy_cores(log_time(own, "first step done"), log_time(own, "last step done"))


def global_examples_per_sec(*summaries: dict[str, Any]) -> float:
    return float(sum(t["examples_per_sec"] for summary in summaries for t in summary["trainers"]))


def free_ports(count: int) -> list[int]:
    """`count` ports free on localhost now."""
    holders = [socket.socket() for _ in range(count)]
    for holder in holders:
        holder.bind(("127.0.0.1", 0))
    ports = [holder.getsockname()[1] for holder in holders]
    for holder in holders:
        holder.close()
    return ports


def import_seconds(at_once: int) -> float:
    """The median wall time of `python -c "import tensorflow"` in `at_once` processes at once."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen([sys.executable, "-c", "import tensorflow"], stderr=subprocess.DEVNULL)
        for _ in range(at_once)
    ]
    times = []
    for process in processes:
        process.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Figures:
    """Each configuration's figures over the runs; medians at the end."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}

    def add(self, name: str, value: float) -> None:
        self._values.setdefault(name, []).append(value)

    def __getitem__(self, name: str) -> float:
        return statistics.median(self._values[name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration")
    arguments = parser.parse_args()
    steps = f"--train_steps={arguments.steps}"
    figures = Figures()
    throughput = {
        "plain": (),
        "one": ("--local_cluster=ps=1,workers=0",),
        "two": ("--local_cluster=ps=1,workers=1",),
    }
    with tempfile.TemporaryDirectory() as scratch, CpuMeter() as meter:
        root = Path(scratch)
        for run in range(arguments.runs):
            [(log, _)] = train(root, [f"teardown{run}"], steps, "--local_cluster=ps=1,workers=2")
            last_exit = max(log_time(log, rf"{task} finished") for task in _CLUSTER_TASKS)
            last_step = log_time(task_log(log, "chief 0"), "last step done")
            figures.add("teardown", last_exit - last_step)
            for role in ("chief", "worker"):
                own = task_log(log, f"{role} 0")
                first_step = log_time(own, "first step done")
                figures.add(f"start {role}", first_step - log_time(log, rf"started {role} 0 "))
                # Its first line, once TensorFlow and the experiment are imported.
                figures.add(f"imported {role}", first_step - log_time(own, rf"{role} 0 on "))
            figures.add("import alone", import_seconds(1))
            figures.add("import at once", import_seconds(len(_CLUSTER_TASKS)))
            for name, flags in throughput.items():
                [(log, summary)] = train(root, [f"{name}{run}"], steps, *THREADS, *flags)
                figures.add(name, global_examples_per_sec(summary))
                figures.add(f"{name} cores", busy_while_training(meter, log))
            pair = train(root, [f"pair{run}a", f"pair{run}b"], steps, *THREADS)
            figures.add("pair", global_examples_per_sec(*(summary for _, summary in pair)))
            figures.add("pair cores", busy_while_training(meter, pair[0][0]))
    print(f"runtime: mnist_deep, {arguments.steps} steps, batch 64, {arguments.runs} runs each")
    print(f"  teardown (ps=1, workers=2)   median {figures['teardown']:.2f} s  target <= 2 s")
    ratio(figures, "scaling 2 vs 1 trainer", "two", "one", "target >= 1.6x")
    ratio(figures, "  2 plain processes vs 1", "pair", "plain", "what sharing nothing gives")
    ratio(figures, "1 trainer + ps vs 1 process", "one", "plain", "target >= 0.9x")
    alone, together = figures["import alone"], figures["import at once"]
    print(
        f"  import tensorflow            median {alone:.2f} s alone, {together:.2f} s in "
        f"{len(_CLUSTER_TASKS)} processes at once"
    )
    for role in ("chief", "worker"):
        start = figures[f"start {role}"]
        print(
            f"  start to first step, {role:6s} median {start:.2f} s = import + {start - alone:.2f}"
            f" s alone, + {start - together:.2f} s at once; {figures[f'imported {role}']:.2f} s"
            " after its own imports  target <= import + 1.5 s"
        )


def ratio(figures: Figures, label: str, over: str, under: str, target: str) -> None:
    print(
        f"  {label:28s} {figures[over]:7.1f} vs {figures[under]:7.1f} examples/s "
        f"= {figures[over] / figures[under]:.2f}x  {target}; cores busy "
        f"{figures[f'{over} cores']:.1f} vs {figures[f'{under} cores']:.1f}"
    )


if __name__ == "__main__":
    main()

"""Whole-process time to resolve one task's cluster: tfconfig-slurm against TensorFlow's resolver.

One task (a worker in the middle) of a step of 4096 nodes x 9 tasks (1 ps + 8 GPUs each).
Ours: `python -m tfconfig_slurm.tfconfig` printing the task's TF_CONFIG. TensorFlow's:
`tf.distribute.cluster_resolver.SlurmClusterResolver` building the cluster spec of the same
environment (4096 ps and 32768 workers, the closest its alphabetical job slices come), printed
as JSON. Left to its defaults it crashes on this step: 8 GPUs for 9 tasks a node gives
gpus_per_task = 8 // 9 = 0 and `range(0, 8, 0)` raises; so it is told gpus_per_node=9,
gpus_per_task=1, a fiction that lets it finish. Both run in fresh processes, alternately, in
this one run; medians and their ratio are printed. Targets: ours under 0.1 s and at least 30x
faster. For scale it also times, in the same loop, the floor any absl command has here: a bare
`python -c pass` and `python -c "import absl.flags"`.

  .venv/bin/python bench/resolve.py [--runs 15] [--tf_runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NODES = 4096
TASKS_PER_NODE = 9
GPUS = "0,1,2,3,4,5,6,7"
RANK = NODES * TASKS_PER_NODE // 2 + 1  # node 2049, local id 1: a worker
TARGET_SECONDS = 0.1
TARGET_RATIO = 30.0

TF_RESOLVER = f"""
import json
import tensorflow as tf
resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
    jobs={{"ps": {NODES}, "worker": {NODES * (TASKS_PER_NODE - 1)}}},
    gpus_per_node={TASKS_PER_NODE}, gpus_per_task=1, auto_set_gpu=False,
)
print(json.dumps(resolver.cluster_spec().as_dict()))
"""


def step_environment() -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(RANK),
        "SLURM_NODEID": str(RANK // TASKS_PER_NODE),
        "SLURM_LOCALID": str(RANK % TASKS_PER_NODE),
        "SLURMD_NODENAME": f"gpu{RANK // TASKS_PER_NODE + 1:04d}",
        "SLURM_STEP_NODELIST": f"gpu[0001-{NODES:04d}]",
        "SLURM_STEP_TASKS_PER_NODE": f"{TASKS_PER_NODE}(x{NODES})",
        "SLURM_STEP_NUM_TASKS": str(NODES * TASKS_PER_NODE),
        "SLURM_STEP_GPUS": GPUS,
        "CUDA_VISIBLE_DEVICES": GPUS,
        "SLURM_GPUS_ON_NODE": "8",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }


def timed(command: list[str], environ: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, env=environ, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, result.stdout


def addresses(cluster: dict[str, list[str]]) -> int:
    return sum(len(tasks) for tasks in cluster.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of ours")
    parser.add_argument("--tf_runs", type=int, default=5, help="runs of TensorFlow's")
    arguments = parser.parse_args()
    environ = step_environment()
    ours_command = [sys.executable, "-m", "tfconfig_slurm.tfconfig"]
    tf_command = [sys.executable, "-c", TF_RESOLVER]

    # The same TF_CONFIG with a flag given (the defaults' own): through absl's flags, as
    # every call went before the call without arguments skipped them.
    floors: dict[str, list[float]] = {
        "python -c pass": [],
        "python -c 'import absl.flags'": [],
        "tfconfig-slurm --ps_per_node=1": [],
    }
    floor_commands = [
        [sys.executable, "-c", "pass"],
        [sys.executable, "-c", "import absl.flags"],
        [*ours_command, "--ps_per_node=1"],
    ]
    ours: list[float] = []
    theirs: list[float] = []
    for run in range(max(arguments.runs, arguments.tf_runs)):
        if run < arguments.runs:
            seconds, output = timed(ours_command, environ)
            ours.append(seconds)
            assert addresses(json.loads(output)["cluster"]) == NODES * TASKS_PER_NODE
            for times, command in zip(floors.values(), floor_commands):
                times.append(timed(command, environ)[0])
        if run < arguments.tf_runs:
            seconds, output = timed(tf_command, environ)
            theirs.append(seconds)
            assert addresses(json.loads(output)) == NODES * TASKS_PER_NODE

    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    ratio = theirs_median / ours_median
    print(
        f"resolve: rank {RANK} of {NODES} nodes x {TASKS_PER_NODE} tasks "
        f"({NODES * TASKS_PER_NODE} tasks, 8 GPUs per node), whole process"
    )
    print(f"  tfconfig-slurm          {len(ours):3d} runs  median {ours_median:.3f} s")
    print(f"  TF SlurmClusterResolver {len(theirs):3d} runs  median {theirs_median:.3f} s")
    print(f"  ratio                   {ratio:.1f}x faster")
    for name, times in floors.items():
        print(f"  for scale: {name:30s} median {statistics.median(times):.3f} s")
    met = ours_median < TARGET_SECONDS and ratio >= TARGET_RATIO
    print(
        f"  targets: under {TARGET_SECONDS} s and at least {TARGET_RATIO:.0f}x: "
        + ("met" if met else "NOT met")
    )


if __name__ == "__main__":
    main()

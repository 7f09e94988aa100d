"""A user's own Estimator script on the real SLURM test cluster, both ways the README shows:
seconds from the chief's return from train_and_evaluate to the end of the srun step.

- with-tfconfig: the stock premade-DNNClassifier script (tests/fixtures/premade_estimator.py)
  under `srun launch/with-tfconfig python script.py`; the wrapper ends the parameter servers'
  server.join() once both trainers' scripts have exited 0.
- one import: the same script calling tfconfig_slurm.train_and_evaluate
  (tests/fixtures/one_import_estimator.py) under a plain `srun python script.py`; the
  runtime's parameter servers exit by themselves.

Each on 2 nodes x (1 ps + 1 trainer), 200 steps, alternating, `--runs` times each. The chief's
return is when its script prints that it returned (srun --label, read as it comes). Needs
root and the test cluster (it starts it).

  .venv/bin/python bench/scripts.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cli import REPOSITORY
from tests.slurm_cluster import SCRIPT, STATE, SlurmCluster

_FIXTURES = REPOSITORY / "tests" / "fixtures"
_WAYS = {
    "with-tfconfig": [str(REPOSITORY / "launch" / "with-tfconfig"), "python",
                      str(_FIXTURES / "premade_estimator.py")],
    "one import": ["python", str(_FIXTURES / "one_import_estimator.py")],
}  # fmt: skip
_RETURNED = {"with-tfconfig": "train_and_evaluate returned", "one import": "returned {"}
_BOUND_SECONDS = 300.0


def return_to_end(cluster: SlurmCluster, way: str, model_dir: Path) -> float:
    """Seconds from the chief's return to the step's end; fails on a step that fails."""
    command = ["srun", "--nodes=2", "--ntasks-per-node=2", "--label", *_WAYS[way]]
    step = subprocess.Popen(
        [*command, str(model_dir), "200"],
        env=cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert step.stdout is not None
    returned = None
    for line in step.stdout:
        if returned is None and _RETURNED[way] in line:
            returned = time.monotonic()
    status = step.wait(timeout=_BOUND_SECONDS)
    ended = time.monotonic()
    if status != 0 or returned is None:
        raise SystemExit(f"{way}: the step failed (exit {status}) or no chief returned")
    return ended - returned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    subprocess.run([str(SCRIPT), "up"], check=True)
    cluster = SlurmCluster(STATE / "slurm.conf")
    seconds: dict[str, list[float]] = {way: [] for way in _WAYS}
    for _ in range(args.runs):
        for way in _WAYS:
            with tempfile.TemporaryDirectory(prefix="scripts-", dir=STATE) as folder:
                seconds[way].append(return_to_end(cluster, way, Path(folder) / "model"))
                print(f"{way}: {seconds[way][-1]:.2f} s", flush=True)
    print("\nseconds from the chief's return to the step's end (2 nodes x (ps + trainer))")
    for way, values in seconds.items():
        runs = ", ".join(f"{value:.1f}" for value in values)
        print(f"  {way:14s} median {statistics.median(values):.1f} s  ({runs})")
    ratio = statistics.median(seconds["with-tfconfig"]) / statistics.median(seconds["one import"])
    print(f"  with-tfconfig / one import: {ratio:.2f}x")


if __name__ == "__main__":
    main()

"""`tfconfig-slurm runs` over an output root of N finished runs (state.json, summary.json and a
checkpoint file each, as the runtime leaves them): seconds for the whole command, as a user on
a login node waits for it, against `python -c pass` on the same machine.

  .venv/bin/python bench/runs_table.py [--runs 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for index in range(args.runs):
            run = root / f"sweep-{index}"
            run.mkdir()
            hparams = {"learning_rate": 0.001 * (index + 1), "dropout": 0.5}
            state = {"state": "done", "hparams": hparams, "job_id": f"100_{index}"}
            (run / "state.json").write_text(json.dumps(state))
            summary = {
                "eval": {"accuracy": 0.9, "loss": 0.1},
                "trainers": [{"examples_per_sec": 1.0}],
            }
            (run / "summary.json").write_text(json.dumps(summary))
            (run / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-2000"\n')
        table = [
            sys.executable,
            "-m",
            "tfconfig_slurm.commands",
            "runs",
            str(root),
            "--sort=accuracy",
        ]
        python = [sys.executable, "-c", "pass"]
        for _ in range(args.repeat):
            seconds, baseline = timed(table), timed(python)
            print(
                f"runs table of {args.runs} runs: {seconds:.2f} s; python -c pass: {baseline:.2f} s"
            )


if __name__ == "__main__":
    main()

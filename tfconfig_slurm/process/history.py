"""What a run directory already holds, said before an attempt starts: a new run, a run resumed
from its checkpoint's step (trained last by which job, when), or one at its last step already,
with nothing to train. A batch script prints it into the job's .out (`--print_model_dir`), so
that a job never carries on another run without saying so. No TensorFlow here.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from tfconfig_slurm.process import reports
from tfconfig_slurm.process.run_dir import RunDir

# TensorFlow's `checkpoint` file: `model_checkpoint_path: "model.ckpt-600"` (Estimator) or
# `"ckpt-600"` (the Keras backends).
# Estimator's model.ckpt-N, tf-keras's ckpt-N, Keras 3's ckpt-N.weights.h5.
_LATEST = re.compile(r'^model_checkpoint_path: "(?:.*/)?(?:model\.)?ckpt-(\d+)[."]', re.M)


def checkpoint_step(model_dir: Path) -> int | None:
    """The step of the directory's latest checkpoint, as TensorFlow's index names it; None
    where there is none."""
    try:
        latest = _LATEST.search(RunDir(model_dir).checkpoint_index.read_text())
    except (OSError, ValueError):
        # Not there, unreadable, or not text: no checkpoint TensorFlow could resume from.
        return None
    return int(latest.group(1)) if latest else None


def before_start(model_dir: Path, train_steps: int) -> str:
    """One line: what an attempt that trains to `train_steps` in `model_dir` does with what it
    finds there."""
    step = checkpoint_step(model_dir)
    if step is None:
        return f"{model_dir}: a new run, to step {train_steps}"
    state = reports.read_state(model_dir)
    job = state.get("job_id")
    when = state.get("updated")
    last = (
        f"last trained {f'by job {job}' if job else 'outside SLURM'}"
        + (f" at {time.strftime('%Y-%m-%d %H:%M', time.localtime(when))}" if when else "")
        + (f", {state['state']}" if state.get("state") else "")
    )
    if step < train_steps:
        return f"{model_dir}: resumes the run at step {step}, to step {train_steps} ({last})"
    return (
        f"{model_dir}: the run is at step {step} already, and training ends at step "
        f"{train_steps}: nothing to train, it is only evaluated ({last}). HINT: raise the steps "
        "to train on, or give another experiment id (EXPERIMENT_ID, --experiment_id) to start "
        "a new run"
    )

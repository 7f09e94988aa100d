"""The task lifecycle (process/task/lifecycle.py) around a backend that imports no TensorFlow: what
the run's state and the task's end are, whatever the backend does. No TensorFlow, no SLURM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import pytest

from tests import fake_backend
from tests.cli import PACED, checkpoint_step, free_port_block, run_module
from tests.slurm_envs import task_env
from tfconfig_slurm.commands import runtime_backends
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import claim, history
from tfconfig_slurm.process.task import lifecycle
from tfconfig_slurm.process.task.place import Place


class Backend:
    """A backend whose training takes no step: it ends the task, or (a bug) returns."""

    experiment = "nothing"
    hparams: Mapping[str, Any] = {}
    train_steps = 10

    def __init__(self, *, ends: bool) -> None:
        self._ends = ends

    def checkpoint_step(self) -> int | None:
        return None

    def start_details(self) -> tuple[str, ...]:
        return ()

    def write_hparams(self, hparams: Mapping[str, Any], trial_id: str) -> None:
        pass

    def train(self, end: Callable[[lifecycle.Ending], Any]) -> Any:
        return end(lifecycle.Ending(None, result="trained")) if self._ends else "returned"


FAKE = fake_backend.environ()


def task(model_dir: Path) -> lifecycle.TaskRun:
    return lifecycle.TaskRun(
        place=Place(role=None, node="here", gpus="any", layout_source="TF_CONFIG"),
        model_dir=model_dir,
        naming=claim.CLI_NAMING,
        stop=preemption.StopRequest(),
        stop_policy=preemption.StopPolicy((), 3),
        environ={},
        job=None,
    )


def state(model_dir: Path) -> str:
    return str(json.loads((model_dir / "state.json").read_text())["state"])


def test_a_backend_that_ends_its_task_returns_its_result_and_the_run_is_done(
    tmp_path: Path,
) -> None:
    result = lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))
    assert result == "trained" and state(tmp_path) == "done"


def test_a_backend_that_returns_without_ending_fails_the_run_and_says_so(tmp_path: Path) -> None:
    """It used to leave state.json at "running" and the task's exit 0."""
    with pytest.raises(lifecycle.BackendError, match="returned from its training without"):
        lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=False))
    assert state(tmp_path) == "failed"


@pytest.mark.parametrize(
    ("index", "refusal"),
    [
        (
            'model_checkpoint_path: "ckpt-40"\n',
            "whose latest checkpoint (ckpt-40) is tf-keras's, not Estimator's: another "
            "backend trained it",
        ),
        (
            'model_checkpoint_path: "/old/place/ckpt-7.weights.h5"\n',
            "whose latest checkpoint (ckpt-7.weights.h5) is Keras 3's, not Estimator's",
        ),
        ("", "names no checkpoint (empty or garbled"),
        (
            'model_checkpoint_path: "model.ckpt-999"\n',
            "names model.ckpt-999, which is not there (deleted, or not copied along with the "
            "index)",
        ),
    ],
    ids=["tf-keras", "keras-3", "empty-index", "files-gone"],
)
def test_a_directory_the_backend_cannot_resume_is_refused_untouched(
    tmp_path: Path, index: str, refusal: str
) -> None:
    """Restored as it stands, a tf-keras model found nothing in an Estimator's checkpoint,
    started at step 0 and wrote over its index; an empty index was a traceback."""
    (tmp_path / "checkpoint").write_text(index)
    with pytest.raises(UsageError) as refused:
        lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))
    assert refused.value.culprit == "--experiment_id"
    assert f"names {tmp_path}, " in refused.value.problem and refusal in refused.value.problem
    assert "give this run its own --experiment_id" in refused.value.hint
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]
    assert (tmp_path / "checkpoint").read_text() == index


def test_a_checkpoint_whose_index_was_cut_short_is_refused_untouched(tmp_path: Path) -> None:
    """TensorFlow's restore of it failed in a traceback (`not an sstable (bad magic number)`)
    in every task, after --print_model_dir had said that the run resumes."""
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-120"\n')
    index = tmp_path / "model.ckpt-120.index"
    index.write_bytes((b"\1" * 200 + history.TABLE_MAGIC)[:100])
    with pytest.raises(UsageError) as refused:
        lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))
    assert refused.value.problem == (
        f"names {tmp_path}, whose latest checkpoint model.ckpt-120 has an index cut short "
        f"({index}: a disk that filled, or a copy that stopped?)"
    )
    assert '"<the checkpoint before it>", to resume from that one' in refused.value.hint
    assert len(index.read_bytes()) == 100


def test_a_directory_of_another_experiment_s_run_is_refused_untouched(tmp_path: Path) -> None:
    """Resumed, a model of another shape failed in TensorFlow's traceback, and its run's
    record was marked failed, with this experiment's name."""
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-400"\n')
    record = '{"experiment": "mnist_deep", "state": "done"}'
    (tmp_path / "model.ckpt-400.index").write_bytes(history.TABLE_MAGIC)
    (tmp_path / "state.json").write_text(record)
    with pytest.raises(UsageError) as refused:
        lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))
    assert refused.value.problem == (
        f"names {tmp_path}, a run of 'mnist_deep', not of 'nothing': it would resume another "
        "model's checkpoints and write over that run's record"
    )
    assert (tmp_path / "state.json").read_text() == record
    # The same script, named by its file (with-tfconfig) where it was by its stem: the same.
    (tmp_path / "state.json").write_text('{"experiment": "nothing.py", "state": "done"}')
    assert lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))


def test_a_directory_of_the_backends_own_checkpoints_resumes(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-40"\n')
    (tmp_path / "model.ckpt-40.index").write_bytes(history.TABLE_MAGIC)
    assert history.latest_checkpoint(tmp_path) == history.Checkpoint(
        "model.ckpt-40", 40, history.ESTIMATOR, "model.ckpt-40"
    )
    result = lifecycle.run(task(tmp_path), lifecycle.ESTIMATOR, lambda: Backend(ends=True))
    assert result == "trained" and state(tmp_path) == "done"


def test_a_run_trained_already_is_evaluated_with_the_hparams_it_was_trained_with(
    tmp_path: Path,
) -> None:
    """Nothing trains, so the model evaluated is the one trained: built with other hparams, a
    newcomer's finished run was evaluated on its input scaled by -1, and its accuracy
    overwritten with 0.02. Where steps are left to train, the hparams given apply."""
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-200"\n')
    (tmp_path / "state.json").write_text('{"hparams": {"scale": 1.0, "units": 8}}')
    given = {"scale": -1.0, "units": 8, "added": True}
    kept = runtime_backends.trained_with(tmp_path, given, train_steps=200)
    assert kept == {"scale": 1.0, "units": 8, "added": True}
    assert runtime_backends.trained_with(tmp_path, given, train_steps=300) == given
    # A tuple is a list in state.json: the same value, kept as given, and no warning.
    (tmp_path / "state.json").write_text('{"hparams": {"units": [64, 32]}}')
    kept = runtime_backends.trained_with(tmp_path, {"units": (64, 32)}, train_steps=200)
    assert kept == {"units": (64, 32)} and isinstance(kept["units"], tuple)


def test_the_job_that_last_trained_a_run_is_named_not_one_that_only_evaluated(
    tmp_path: Path,
) -> None:
    """A job that found the run at its last step evaluated it and trained nothing; it was
    said to have trained it last."""
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-101"\n')
    (tmp_path / "model.ckpt-101.index").write_bytes(history.TABLE_MAGIC)
    attempts = [{"job_id": "3_0", "from_step": None}, {"job_id": "17", "from_step": 101}]
    record = {"state": "done", "job_id": "17", "updated": 1.8e9, "attempts": attempts}
    (tmp_path / "state.json").write_text(json.dumps(record))
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(1.8e9))
    assert history.before_start(tmp_path, 200) == (
        f"{tmp_path}: resumes the run at step 101, to step 200 (last trained by job 3_0, then "
        f"evaluated by job 17 at {at}, done)"
    )
    # An older record's attempt, which did not say its step, trained for all anyone knows.
    record["attempts"] = [{"job_id": "3_0"}, {"job_id": "17", "from_step": 101}]
    (tmp_path / "state.json").write_text(json.dumps(record))
    assert "(last trained by job 3_0, then evaluated by job 17 " in history.before_start(
        tmp_path, 200
    )
    # The job that trained it last, as before, where it did.
    record["attempts"] = [{"job_id": "3_0", "from_step": None}, {"job_id": "17", "from_step": 50}]
    (tmp_path / "state.json").write_text(json.dumps(record))
    assert f"(last trained by job 17 at {at}, done)" in history.before_start(tmp_path, 200)


def test_a_task_of_a_step_that_refuses_its_input_at_its_start_ends_its_peers(
    tmp_path: Path,
) -> None:
    """Worker 0 of a 3-task step refuses at its start (as one whose node lacks the data), in a
    step srun runs without --kill-on-bad-exit: it records that as the run's failure, and its
    ps, which never heard from it, ends at once, naming it, rather than wait for it as for a
    task still starting (timing.START_SECONDS, 600 s); the chief ends with its ps."""
    environ = {
        "PATH": os.environ["PATH"],
        **fake_backend.environ(**{fake_backend.REFUSE_AS: "worker 0"}),
    }
    flags = (
        f"--experiment={PACED}", f"--output_root={tmp_path}", "--train_steps=1000000",
        f"--port_base={free_port_block(3)}",
    )  # fmt: skip
    step = [
        subprocess.Popen(
            [sys.executable, "-m", "tfconfig_slurm.run", *flags],
            env={**environ, **task_env(["localhost"], [3], rank)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(3)
    ]
    try:
        ended = [process.wait(timeout=60) for process in step]
    finally:
        for process in step:
            process.kill()
    said = [process.communicate()[1] for process in step]
    # Ranks: ps 0, the chief, worker 0.
    assert ended == [ExitStatus.PEER_LOST, ExitStatus.PEER_LOST, 2], said
    refusal = (
        "TFCONFIG_SLURM_TEST_REFUSE_AS: names worker 0, which refuses on purpose. HINT: unset it"
    )
    assert said[2].endswith(f"tfconfig-slurm-run: {refusal}\n"), said[2]
    first = f"the run failed (first to fail: worker 0 on localhost: {refusal} (exit 2))"
    assert first in said[0] and "as worker 0 is gone" in said[0], said[0]


def test_the_test_suite_s_backend_trains_resumes_and_a_bad_name_of_it_is_one_line(
    tmp_path: Path,
) -> None:
    """The runtime with the fake backend (tests/fake_backend.py) trains, checkpoints and
    resumes as with Estimator, importing no TensorFlow; a variable that names no backend is
    refused in one line that names it, before anything is made."""
    # A TensorFlow that fails to import, first on the path.
    (tmp_path / "poison" / "tensorflow").mkdir(parents=True)
    (tmp_path / "poison" / "tensorflow" / "__init__.py").write_text("raise ImportError('no')\n")
    fake = {**FAKE, "PYTHONPATH": f"{tmp_path / 'poison'}:{FAKE['PYTHONPATH']}"}
    flags = (f"--experiment={PACED}", f"--output_root={tmp_path}", "--save_checkpoints_steps=10")
    first = run_module("tfconfig_slurm.run", *flags, "--train_steps=15", environ=fake)
    assert first.returncode == 0, first.stderr[-3000:]
    assert checkpoint_step(tmp_path / "paced") == 15
    again = run_module("tfconfig_slurm.run", *flags, "--train_steps=25", environ=fake)
    assert again.returncode == 0, again.stderr[-3000:]
    said = "resuming from step 15; the test suite's fake backend"
    assert f"{said} ({runtime_backends.TEST_BACKEND})" in again.stderr
    assert json.loads((tmp_path / "paced" / "summary.json").read_text())["global_step"] == 25
    wrong = {**FAKE, runtime_backends.TEST_BACKEND: "tests.nothing:backend"}
    elsewhere = f"--output_root={tmp_path / 'none'}"
    refused = run_module("tfconfig_slurm.run", *flags, elsewhere, environ=wrong)
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"tfconfig-slurm-run: {runtime_backends.TEST_BACKEND}: is ")
    assert not (tmp_path / "none").exists()

"""The runtime's backends, one factory each (Estimator, tf-keras, its coordinator, Keras 3):
each checks the flags against the experiment before it imports TensorFlow itself, so bad input
is refused at once (a model directory of another backend's or experiment's before any task
starts); and each task's thread pools, sized by its role."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable, TypeVar

from absl import logging

from tfconfig_slurm.cluster.layout import EVALUATOR
from tfconfig_slurm.cluster.role import PS_WORKER_MIN_INTER_OP, Threads, input_shard
from tfconfig_slurm.commands import runtime_flags
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import console
from tfconfig_slurm.process.records import claim, history, reports
from tfconfig_slurm.process.task import lifecycle, native_noise, place
from tfconfig_slurm.process.user_code import experiment as experiment_lib

# What makes a backend for a task, with the run's --hparams.
Factory = Callable[[lifecycle.TaskRun, str], lifecycle.Backend]

# A backend of the test suite (tests/fake_backend.py), as `module:function`, that trains in
# place of the experiment's, so the process machinery's tests import no TensorFlow.
TEST_BACKEND = "TFCONFIG_SLURM_TEST_BACKEND"


def for_kind(kind: str, environ: Mapping[str, str]) -> Factory:
    """The factory of the backend for an experiment of `kind` (or the test backend)."""
    named = environ.get(TEST_BACKEND)
    if not named:
        return {experiment_lib.KERAS: keras, experiment_lib.KERAS3: keras3}.get(kind, estimator)
    module, _, function = named.partition(":")
    try:
        factory: Factory = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError, ValueError) as error:
        raise UsageError(
            TEST_BACKEND,
            f"is {named!r}, which names no function to import ({error})",
            "it is the test suite's, as module:function (tests.fake_backend:backend); "
            "unset it to train with the experiment's own backend",
        ) from None
    return factory


def kind_of(kind: str, coordinator: bool) -> lifecycle.BackendKind:
    """How the backend of an experiment of `kind` trains, and whose checkpoints it resumes."""
    if coordinator:
        return lifecycle.TF_KERAS_COORDINATOR
    kinds = {experiment_lib.KERAS: lifecycle.TF_KERAS, experiment_lib.KERAS3: lifecycle.KERAS_3}
    return kinds.get(kind, lifecycle.ESTIMATOR)


def check_trainable(
    directories: Iterable[Path], spec: str, kind: str, coordinator: bool, named: claim.Naming
) -> None:
    """Refuses, in one line, the first of `directories` that every task of the run would
    refuse at its start: another backend's checkpoints, another experiment's run."""
    writes = kind_of(kind, coordinator).checkpoints
    name, _ = experiment_lib.locate(spec)
    for directory in directories:
        history.check_resumable(directory, writes, named)
        history.check_same_experiment(directory, name, named)


# Threads TensorFlow picks itself: every CPU.
_TENSORFLOW_S = Threads(0, 0)


def _settings(
    directory: Path,
    hparams: str,
    experiment: experiment_lib.Experiment | experiment_lib.KerasExperiment,
    threads: Threads = _TENSORFLOW_S,
) -> lifecycle.TrainingSettings:
    """The flags' settings, with the experiment's hparams overridden by `hparams` (or as
    trained_with keeps them)."""
    shard = input_shard(os.environ)
    return lifecycle.TrainingSettings(
        model_dir=directory,
        train_steps=runtime_flags.TRAIN_STEPS.value,
        eval_steps=runtime_flags.EVAL_STEPS.value,
        params={
            **trained_with(
                directory,
                experiment_lib.with_overrides(
                    experiment.hparams, hparams, experiment.check_hparams
                ),
                runtime_flags.TRAIN_STEPS.value,
            ),
            "batch_size": runtime_flags.BATCH_SIZE.value,
            "data_dir": experiment_lib.checked_data_dir(experiment, runtime_flags.DATA_DIR.value),
            "num_trainers": shard.num_shards,
            "trainer_index": shard.shard_index,
        },
        save_checkpoints_steps=runtime_flags.SAVE_CHECKPOINTS_STEPS.value,
        save_checkpoints_secs=runtime_flags.SAVE_CHECKPOINTS_SECS.value,
        keep_checkpoint_max=runtime_flags.KEEP_CHECKPOINT_MAX.value,
        intra_op_threads=threads.intra_op,
        inter_op_threads=threads.inter_op,
        gpu_memory_growth=runtime_flags.GPU_MEMORY_GROWTH.value,
        gpu_memory_fraction=runtime_flags.GPU_MEMORY_FRACTION.value,
        log_every_steps=runtime_flags.LOG_EVERY_STEPS.value,
        sync_replicas=runtime_flags.SYNC_REPLICAS.value,
        steps_per_execution=runtime_flags.STEPS_PER_EXECUTION.value,
    )


def trained_with(directory: Path, given: dict[str, Any], train_steps: int) -> dict[str, Any]:
    """`given`, or where the run in `directory` is trained already (at `train_steps`), the
    hparams it was trained with: its evaluation builds the model, and with others it would
    evaluate another."""
    step = history.checkpoint_step(directory)
    then = reports.read_state(directory).get("hparams")
    if step is None or step < train_steps or not isinstance(then, dict):
        return given
    # Compared as state.json holds them, JSON's values (a tuple is a list there); a value
    # that compares equal is kept as given.
    as_json = json.loads(json.dumps(given))
    kept = {
        name: then[name] if name in then and then[name] != as_json[name] else value
        for name, value in given.items()
    }
    changed = [f"{name}={value!r}" for name, value in given.items() if kept[name] is not value]
    if changed:
        logging.warning(
            "%s is trained already, so it is evaluated with the hparams it was trained with; "
            "%s would apply only to steps trained",
            directory,
            ", ".join(changed),
        )
    return kept


def keras(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras experiment, and TensorFlow and tf-keras, as its backend."""
    # Keras 2 (tf-keras) for whatever the experiment reaches through tf.keras too.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    experiment, settings = _loaded(task, hparams, experiment_lib.load_keras)
    from tfconfig_slurm.backends.keras.train import KerasBackend  # noqa: PLC0415

    return KerasBackend(experiment, settings, task)


def keras3(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras 3 experiment, and Keras 3 on JAX, as its backend."""
    os.environ.update(experiment_lib.choose_jax(os.environ))
    experiment = experiment_lib.load_keras(runtime_flags.EXPERIMENT.value or "")
    settings = _settings(task.model_dir, hparams, experiment)
    from tfconfig_slurm.backends.keras3.train import Keras3Backend  # noqa: PLC0415

    return Keras3Backend(experiment, settings, task)


def coordinator(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Keras experiment, and TensorFlow and tf-keras, as the coordinator of a
    ParameterServerStrategy cluster, or as its evaluator (a sidecar)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    experiment, settings = _loaded(task, hparams, experiment_lib.load_keras)
    from tfconfig_slurm.backends.keras.coordinator import (  # noqa: PLC0415
        CoordinatorBackend,
        SidecarBackend,
    )

    evaluator = task.place.role is not None and task.place.role.role == EVALUATOR
    return (SidecarBackend if evaluator else CoordinatorBackend)(experiment, settings, task)


def estimator(task: lifecycle.TaskRun, hparams: str) -> lifecycle.Backend:
    """The Estimator experiment, and TensorFlow, as its backend."""
    experiment, settings = _loaded(task, hparams, experiment_lib.load)
    from tfconfig_slurm.backends.estimator.train import EstimatorBackend, training  # noqa: PLC0415

    return EstimatorBackend(
        training(experiment, settings, task.place.role), task.place.role, task.stop
    )


_Loaded = TypeVar("_Loaded", experiment_lib.Experiment, experiment_lib.KerasExperiment)


def _loaded(
    task: lifecycle.TaskRun, hparams: str, load: Callable[[str], _Loaded]
) -> tuple[_Loaded, lifecycle.TrainingSettings]:
    """The experiment and the run's settings, with TensorFlow loaded, its thread pools held,
    its devices looked at and its start-up notes held back (process/task/native_noise.py)."""
    with native_noise.start_up_notes_held(bool(task.place.gpu_ids)):
        experiment = load(runtime_flags.EXPERIMENT.value or "")
        threads, said = task_threads(task.place)
        settings = _settings(task.model_dir, hparams, experiment, threads)
        if said:
            logging.info("%s", said)
        from tfconfig_slurm.backends import tf_process  # noqa: PLC0415

        tf_process.hold_threads(threads.intra_op, threads.inter_op)
        tf_process.look_at_devices()
    return experiment, settings


def check_inter_op_threads(coordinator: bool) -> None:
    """Refuses --inter_op_threads below what a ParameterServerStrategy worker needs."""
    given, least = runtime_flags.INTER_OP_THREADS.value, PS_WORKER_MIN_INTER_OP
    if coordinator and given is not None and 0 < given < least:
        raise UsageError(
            "--inter_op_threads",
            f"is {given}, and a ParameterServerStrategy worker needs {least} or more: the "
            "coordinator's request for a step holds one while the step's ops run on the "
            "others, and with none left the step waits for ever",
            f"leave it out (a worker gets {least} or more), or give {least} or more",
        )


def task_threads(where: place.Place) -> tuple[Threads, str]:
    """The task's TensorFlow threads, from the flags or sized by its role (cluster/role.py),
    and the line that says them, for the caller to log once its input has passed."""
    check_inter_op_threads(where.role is not None and where.role.coordinator)
    cpus = len(os.sched_getaffinity(0))
    sized = (
        _TENSORFLOW_S if where.role is None else where.role.threads(cpus, own_cpus=where.own_cpus)
    )
    intra_op, inter_op = runtime_flags.INTRA_OP_THREADS.value, runtime_flags.INTER_OP_THREADS.value
    given = Threads(
        sized.intra_op if intra_op is None else intra_op,
        sized.inter_op if inter_op is None else inter_op,
    )
    why = (
        "as the flags say"
        if given != sized
        else f"sized for {console.a_or_an(where.role.role if where.role else 'task')} on "
        f"{'its own' if where.own_cpus else 'the node'}'s {cpus} CPUs"
    )
    said = (
        f"TensorFlow's threads: {given.intra_op} inside an op, {given.inter_op} between ops ({why})"
    )
    return given, said if any(given) else ""

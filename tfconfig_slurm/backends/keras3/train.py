"""The Keras 3 backend, on JAX: one process, or one of a run's processes trained as one mesh
(keras.distribution.DataParallel over every process's devices, or ModelParallel by the
experiment's LayoutMap: processes.py), for the lifecycle of process/task/lifecycle.py.

- Every process builds the model under the distribution, restores the model directory's
  latest checkpoint and trains the steps left to --train_steps with model.fit, on the batches
  of the experiment's dataset("train", params) of this process's share of the data
  (params["batch_size"] each: the global batch is that times the shares).
- What follows each step (its line, a checkpoint, a stop agreed on by a gather) is
  process/task/keras_run.py's, as for tf-keras; each process watches its neighbours
  (watch_plan.py) and answers on its own port for theirs (the chief's is JAX's coordination
  service), and the chief writes the reports (keras_run.py).
"""

from __future__ import annotations

import contextlib
import logging as python_logging
import time
import warnings
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable, NamedTuple

import jax
import keras
import numpy as np
from absl import logging

from tfconfig_slurm.backends.keras3 import processes
from tfconfig_slurm.backends.keras3.model_dir import (
    Checkpoints,
    Events,
    built_model,
    export,
    whole,
    write_eval_scalars,
)
from tfconfig_slurm.cluster.layout import CHIEF, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process import timing
from tfconfig_slurm.process.job import preemption
from tfconfig_slurm.process.records import history, reports
from tfconfig_slurm.process.records.attempts import owns_run
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.task import hang_watch, keras_run
from tfconfig_slurm.process.task.keras_run import FitRun, LookAhead, watched_peers
from tfconfig_slurm.process.task.lifecycle import Ending, Hparam
from tfconfig_slurm.process.user_code.experiment import KerasExperiment

# What an experiment's dataset gives, in a refusal's hint.
_BATCHES = (
    "return a generator of (inputs, targets) batches of params['batch_size'] (endless for "
    "'train'; a dict of arrays for a model of named inputs goes as inputs), a "
    "keras.utils.PyDataset, or a tf.data.Dataset"
)
# JAX says at INFO, through Python's logging, which platforms it did not find (a TPU, a proxy).
python_logging.getLogger("jax._src.xla_bridge").setLevel(python_logging.WARNING)
# What fit and evaluate warn of the batches the runtime asks for as meant: a generator is not
# shuffled by fit; the eval set ends where evaluate reads it whole.
warnings.filterwarnings("ignore", message="`shuffle=True` was passed", module="keras")
warnings.filterwarnings("ignore", message="Your input ran out of data", module="keras")
# What a collective raises where a peer is gone, among other failures: JAX's runtime error,
# or where gloo fails in a gather, a ValueError (seen: `UNKNOWN: Gloo AllGather failed: ...
# Connection closed by peer`, in an evaluation).
_COLLECTIVE_ERRORS = (jax.errors.JaxRuntimeError, ValueError)
# How those read where a peer is gone (not this process's own failure, an out-of-memory or a
# compiler's): gloo's "Connection closed by peer" (seen), a reset connection, an unreachable peer.
_LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "UNAVAILABLE")


class Keras3Backend(FitRun):
    """Keras 3 training as the lifecycle's backend (process/task/lifecycle.py): this process's
    model, restored, trained with fit to --train_steps, evaluated and reported."""

    _process: _Process | None = None

    def _set_up(self) -> _Process:
        if self._process is not None:
            return self._process
        experiment, settings, role = self._experiment, self._settings, self._role
        port = contextlib.ExitStack()
        if role is not None and role.role != CHIEF:
            port.enter_context(watchdog.answering(role))
        processes.start(role)
        with _others_end_first(role):
            processes_ = role.trainers if role is not None else 1
            mesh_ = processes.set_up_mesh(experiment, settings.params, processes_)
            params = {
                **settings.params,
                "num_trainers": mesh_.data_shares,
                "trainer_index": mesh_.data_share,
            }
            peers = watched_peers(role)
            if role is not None:
                # Every process must have restored the same checkpoint: where the nodes do not
                # share the model directory, a process finds none where the chief restores one.
                # Checked before any step of JAX's: a process restoring a checkpoint makes other
                # collectives than one that finds none, which JAX takes for a mismatch.
                with _a_lost_peer_named(peers):
                    start = history.checkpoint_step(settings.model_dir) or 0
                    starts = [int(each) for each in processes.gather([start])[:, 0]]
                    history.check_same_start(settings.model_dir, starts, "processes")
            model = built_model(experiment, params)
            checkpoints = Checkpoints(
                model, settings.model_dir, role, settings.keep_checkpoint_max, stop=self._stop
            )
            events = Events(settings.model_dir) if owns_run(role) else None
            shape = (processes_, mesh_.devices)
            self._process = _Process(model, checkpoints, events, mesh_, params, shape, peers, port)
        return self._process

    def checkpoint_step(self) -> int:
        return self._set_up().checkpoints.last

    def start_details(self) -> tuple[str, ...]:
        process = self._set_up()
        processes_, devices = process.shape
        shape = (
            f"{processes_} process{'' if processes_ == 1 else 'es'} and {devices} "
            f"device{'' if devices == 1 else 's'} on JAX"
        )
        if not process.mesh.described:
            return (shape,)
        return (
            f"{shape}, {process.mesh.described}",
            f"data share {process.mesh.data_share + 1} of {process.mesh.data_shares}",
        )

    def write_hparams(self, hparams: Mapping[str, Hparam], trial_id: str) -> None:
        events = self._set_up().events
        if events is not None:
            events.hparams(hparams, trial_id)

    def train(self, end: Callable[[Ending], Any]) -> Any:
        role = self._role
        with _others_end_first(role), _a_lost_peer_named(self._set_up().peers):
            process = self._set_up()
            started, resumed_at = time.monotonic(), process.checkpoints.last
            progress = self._fit_steps(
                resumed_at,
                examples_per_step=self._settings.params["batch_size"],
                scalars=None if process.events is None else process.events.scalars,
                sum_votes=None if role is None else lambda votes: processes.gather(votes).sum(0),
                save=process.checkpoints.save,
            )
            self._fit(process, progress)
            return self._fit_ended(progress, (started, resumed_at), end, write_eval_scalars)

    def _fit(self, process: _Process, progress: keras_run.FitSteps) -> None:
        """Trains the steps left to --train_steps, or until a stop is agreed on."""
        settings = self._settings
        fed: LookAhead | None = None
        try:
            if progress.step < settings.train_steps:
                # From where the run is: an experiment's data goes on there (the docs).
                train = {**process.params, "global_step": progress.step}
                steps = settings.train_steps - progress.step
                batches = _batches(self._experiment, "train", train)
                fed = self._fed(batches, steps)
                hang_watch.began(progress.step)
                with _steps_per_execution(process.model, settings.steps_per_execution):
                    process.model.fit(
                        batches if fed is None else fed.batches(),
                        epochs=1,
                        steps_per_epoch=steps,
                        callbacks=_Callbacks(
                            [keras_run.callback(keras.callbacks.Callback, progress)],
                            add_history=True,
                            model=process.model,
                        ),
                        verbose=0,
                    )
        finally:
            if fed is not None:
                fed.close()
            hang_watch.paused()
            progress.lines.close()
        if progress.stopped_on is None and progress.step < settings.train_steps:
            raise UsageError(
                "--experiment",
                f"{self._experiment.name}.dataset('train', params) ran out at global step "
                f"{progress.step}, before --train_steps={settings.train_steps}",
                "return endless training batches (e.g. loop over the data in a while True)",
            )

    def _fed(self, batches: Any, steps: int) -> LookAhead | None:
        """An experiment's generator, read ahead to --train_steps (process/task/keras_run.py:
        at most the steps left, read on a thread of their own and placed there, _placement);
        None for a keras.utils.PyDataset or a tf.data.Dataset, which read ahead themselves,
        and which are refused with --steps_per_execution: fit would read them past
        --train_steps. fit runs --steps_per_execution steps a call and reads that many batches
        each; the last call would run past --train_steps (Keras's epoch iterator asks for whole
        executions), so the batches end there and the call runs the steps left. Called on the
        training thread, where Keras keeps the run's distribution (per thread)."""
        if hasattr(batches, "__next__"):
            return LookAhead(batches, steps, _placement(keras.distribution.distribution()))
        if (self._settings.steps_per_execution or 1) > 1:
            raise UsageError(
                "--steps_per_execution",
                f"{self._experiment.name}.dataset('train', params) returned a "
                f"{type(batches).__name__}, which fit would read past --train_steps in a call of "
                "several steps",
                "leave --steps_per_execution out, or yield the batches from a generator",
            )
        return None

    def _evaluated(self, step: int) -> dict[str, Any] | None:
        """Every process reads the eval set whole. A single process told to stop meanwhile
        stops there (an eval set that never ends would otherwise hold it until SLURM kills
        it); the processes of a cluster evaluate to the end: one alone that stopped would
        leave the others in a collective."""
        process = self._set_up()
        _check_same_weights(process.model, self._role)
        process.checkpoints.save(step)
        stop = _StopEvaluating(self._task.stop) if self._role is None else None
        reports.say_evaluating(step, self._settings.eval_steps)
        metrics = process.model.evaluate(
            _whole_parts(
                _batches(self._experiment, "eval", self._settings.params), process.mesh.batch_parts
            ),
            steps=self._settings.eval_steps,
            return_dict=True,
            verbose=0,
            callbacks=_Callbacks([stop] if stop else [], model=process.model),
        )
        if stop is not None and stop.stopped:
            logging.info("stopping on %s during the evaluation", self._task.stop.signal_name)
            return None
        return {**{name: float(value) for name, value in metrics.items()}, "global_step": step}

    def _export(self) -> None:
        export(self._set_up().model, self._settings.model_dir, self._experiment.name, self._role)

    def _stop_watching(self) -> None:
        # This process's port answers until it ends (_end_together).
        process = self._set_up()
        if process.peers is not None:
            process.peers.stop()
        if process.events is not None:
            process.events.close()

    def _end_together(self) -> None:
        """The chief, whose process holds the run's JAX service, ends last: the others' JAX
        clients abort their process once the service is gone (`Terminating process because
        the JAX distributed service detected fatal errors`), and jax.distributed.shutdown's
        barrier holds no process back where a lost one may not end the others
        (processes.start). So the chief waits until every other's port, closed by its end, no
        longer answers."""
        role = self._role
        if role is None or role.role != CHIEF:
            return
        others = role.named(WORKER)
        watchdog.until_gone(others)
        logging.info(
            "the %d other process%s ended", len(others), " has" if len(others) == 1 else "es have"
        )


class _Process(NamedTuple):
    """This process, set up: its model and checkpoints, the chief's event writer, the shape
    of the run, and the watch of its neighbours with its own port answering."""

    model: Any
    checkpoints: Checkpoints
    events: Events | None
    mesh: processes.Mesh
    # The experiment's params, with this process's share of the training data.
    params: Mapping[str, Any]
    # (processes, devices) of the run.
    shape: tuple[int, int]
    peers: watchdog.PeerWatch | None
    # Open until the process ends, for the chief to see it gone (_end_together).
    port: contextlib.ExitStack


@contextlib.contextmanager
def _others_end_first(role: ClusterRole | None) -> Iterator[None]:
    """A chief whose process fails gives the others a few seconds to end first (they fail
    of the same cause, most often), so that each says its own error rather than JAX's abort
    of a process whose coordination service is gone (_end_together)."""
    try:
        yield
    except BaseException:
        if role is not None and role.role == CHIEF:
            watchdog.until_gone(role.named(WORKER), within=timing.FAILING_SECONDS)
        raise


@contextlib.contextmanager
def _a_lost_peer_named(peers: watchdog.PeerWatch | None) -> Iterator[None]:
    """A collective that fails as a peer is gone, wherever it runs (fit, the checks of the
    same start and the same weights, a checkpoint's or an export's gather, the evaluation):
    the peer lost is named and this task ends as a loss, which the step's restart takes for
    one, not as the run's own failure, which would blame a survivor and end the job."""
    try:
        yield
    except _COLLECTIVE_ERRORS as error:
        if peers is None or not any(words in str(error) for words in _LOST_PEER):
            raise
        first = str(error).splitlines()[0] if str(error) else ""
        peers.end_for_a_lost_peer(
            f"the processes' collective failed ({type(error).__name__}: {first})", str(error)
        )


@contextlib.contextmanager
def _steps_per_execution(model: Any, steps: int | None) -> Iterator[None]:
    """Runs fit `steps` steps a call of its step function where the experiment's compile left
    Keras's 1, and its evaluation as compiled: evaluate(steps=--eval_steps) would read past
    them a whole call."""
    compiled = model.steps_per_execution
    if steps is not None and compiled not in (1, steps):
        logging.info(
            "--steps_per_execution=%d not applied: the experiment compiled its model with "
            "steps_per_execution=%d",
            steps,
            compiled,
        )
    if steps is not None and compiled == 1:
        model.steps_per_execution = steps
    try:
        yield
    finally:
        model.steps_per_execution = compiled


def _check_same_weights(model: Any, role: ClusterRole | None) -> None:
    """Says that every process holds the same weights at the end, from a checksum of each
    one's: a data-parallel run's replicas must not drift apart."""
    if role is None:
        return
    checksum = 0
    with whole(model):
        arrays = model.get_weights()
    for weights in arrays:
        checksum = zlib.crc32(np.ascontiguousarray(weights).tobytes(), checksum)
    checksums = processes.gather([checksum])[:, 0]
    if len(set(checksums.tolist())) != 1:
        raise RuntimeError(
            f"the {len(checksums)} processes ended with different weights (checksums "
            f"{', '.join(f'{value:08x}' for value in checksums)})"
        )
    logging.info("the %d processes hold the same weights (checksum %08x)", len(checksums), checksum)


def _batches(experiment: KerasExperiment, mode: str, params: Mapping[str, Any]) -> Any:
    """The experiment's batches for `mode`, refused in one line unless fit can read them, or
    where the experiment refused its params (a ValueError as dataset is called)."""
    called = f"{experiment.name}.dataset({mode!r}, params)"
    try:
        batches = experiment.dataset(mode, params)
    except ValueError as error:
        raise UsageError(
            "--experiment",
            f"{called} refused them: {error}",
            "change what it names (e.g. --batch_size), or its data",
        ) from None
    except ModuleNotFoundError as error:
        raise UsageError(
            "--experiment",
            f"{called} imports {error.name}, which this Python does not have",
            "yield numpy batches (a generator) or a keras.utils.PyDataset, which Keras 3 on JAX "
            f"reads without TensorFlow; or install {error.name} beside it",
        ) from None
    if hasattr(batches, "__next__"):
        return _first_checked(batches, called)
    if isinstance(batches, (tuple, list, dict)) or not (
        isinstance(batches, keras.utils.PyDataset)
        or type(batches).__module__.startswith("tensorflow")
    ):
        raise UsageError(
            "--experiment",
            f"{called} returned {type(batches).__name__!r}, not batches that fit reads one at a "
            "time",
            _BATCHES,
        )
    return batches


def _first_checked(batches: Iterator[Any], called: str) -> Iterator[Any]:
    """`batches` whole, their first read here: refused in one line where it is not (inputs,
    targets) or (inputs, targets, sample weights), which Keras says in 47 lines."""
    first = next(batches, None)
    if first is None:
        raise UsageError("--experiment", f"{called} yields no batch", _BATCHES)
    if not isinstance(first, tuple) or len(first) not in (2, 3):
        keys = f" of {', '.join(map(repr, first))}" if isinstance(first, dict) else ""
        shape = f"a tuple of {len(first)}" if isinstance(first, tuple) else type(first).__name__
        raise UsageError(
            "--experiment", f"{called} yields batches of {shape}{keys}, not (inputs, targets)",
            _BATCHES,
        )  # fmt: skip
    return _after(first, batches)


def _after(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    # A generator: Keras's adapters take no other iterator (an itertools.chain is refused).
    yield first
    yield from rest


def _placement(distribution: Any) -> Callable[[Any], Any]:
    """How a batch is put on this process's devices before fit reads it, in one process: each
    array (a None, such as absent sample weights, left so) as the distribution lays out data,
    or on the default device, as Keras would (the same arrays, so Keras's own placement is then
    a no-op). In a step of several processes, not at all: Keras makes the global array from
    each process's part as fit reads it."""
    if jax.process_count() > 1:
        return lambda batch: batch

    def placed(array: Any) -> Any:
        if distribution is None:
            return jax.device_put(array)
        return jax.device_put(array, distribution.get_data_layout(array.shape).backend_layout)

    return lambda batch: keras.tree.map_structure(placed, batch, none_is_leaf=False)


def _whole_parts(batches: Any, parts: int) -> Any:
    """The eval batches, each of a multiple of `parts` examples, as JAX splits a process's
    batch over its devices (a last batch of 39 digits over 2 devices failed the evaluation of
    every run on such a node): a short one is padded with copies of its last example that
    weigh 0, and every batch is given its weights, so that the metrics are the examples'.
    Batches other than tuples of arrays (a PyDataset, a tf.data.Dataset) go as they are."""
    if parts == 1 or not hasattr(batches, "__next__"):
        return batches
    return (_padded(batch, parts) for batch in batches)


def _padded(batch: Any, parts: int) -> Any:
    if not isinstance(batch, tuple) or len(batch) not in (2, 3):
        return batch
    inputs, targets, *weighed = batch
    count = len(keras.tree.flatten(inputs)[0])
    weights = weighed[0] if weighed and weighed[0] is not None else np.ones(count, np.float32)
    short = -count % parts

    def padded(array: Any) -> Any:
        return np.concatenate([array, np.repeat(array[-1:], short, axis=0)])

    return (
        keras.tree.map_structure(padded, inputs),
        keras.tree.map_structure(padded, targets),
        np.concatenate([weights, np.zeros(short, np.float32)]),
    )


class _Callbacks(keras.callbacks.CallbackList):  # type: ignore[misc]
    """Keras's list of callbacks, but a batch's end reaches them on the training thread with
    its logs as the step left them, on the devices. Keras's own list reads every value back
    each step: on the training thread where a callback is not async_safe (the host then waits
    for each step before it dispatches the next: 0.56-0.66x of a plain fit on a GPU), or in its
    thread pool where all are (where the runtime's decisions cannot run: a checkpoint read
    there finds arrays the next step has donated). Here a callback reads what it needs, when
    it needs it (keras_run.Lines: the loss at a line, on a thread of its own)."""

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        for callback in self.callbacks:
            callback.on_train_batch_end(batch, logs)

    def on_test_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        for callback in self.callbacks:
            callback.on_test_batch_end(batch, logs)


class _StopEvaluating(keras.callbacks.Callback):  # type: ignore[misc]
    """Ends an evaluation at its next batch once the process is told to stop."""

    def __init__(self, stop: preemption.StopRequest) -> None:
        super().__init__()
        self._stop = stop
        self.stopped = False

    def on_test_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._stop.requested:
            self.stopped = True
            self.model.stop_evaluating = True

"""Run a command as this SLURM task: with its TF_CONFIG and CUDA_VISIBLE_DEVICES, supervised.

  srun launch/with-tfconfig python my_estimator_script.py --my_flag=1
  srun launch/with-tfconfig --ps_per_node=0 --override python my_script.py

Layout flags go before the command; everything from the command on is passed to it untouched.
The command runs as a child: signals reach it, its exit status comes back out, a parameter
server's command (which never returns) is ended once every trainer's has exited 0, and a task
whose peer is lost is ended by name with exit status 3 (docs/with-tfconfig.md says more);
with --model_dir, the first task to fail is recorded there. In a --coordinator step
(ParameterServerStrategy) the coordinator's exit ends every task, and a worker's command that
fails is started again.
A TF_CONFIG inherited from the shell that submitted the job is replaced, with a warning; one
already made for this step (a nested with-tfconfig) that differs is kept, and the command
refused, unless --override.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from absl import flags, logging

from tfconfig_slurm.backends.keras3 import boot
from tfconfig_slurm.cluster import render
from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, ClusterLayout
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import read_slurm_job
from tfconfig_slurm.commands import layout_flags, model_dir_flag
from tfconfig_slurm.commands.cli import run_cli
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.records import claim, failure, history
from tfconfig_slurm.process.records.attempts import RunOwner, owns_run
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import supervise, watchdog
from tfconfig_slurm.process.task import place
from tfconfig_slurm.process.user_code import versions

PROGRAM = "with-tfconfig"
# Linux refuses to exec with any single "NAME=value" string longer than MAX_ARG_STRLEN
# (32 pages of 4 KiB, the terminating NUL included).
MAX_ENVIRONMENT_STRING = 32 * 4096

OVERRIDE = flags.DEFINE_boolean(
    "override", False, "Replace a TF_CONFIG that is already set to a different value."
)
WORKER_RESTARTS = flags.DEFINE_integer(
    "worker_restarts",
    supervise.WORKER_RESTARTS,
    "In a --coordinator step (ParameterServerStrategy), how often a worker's command that "
    "failed is started again on its port: the coordinator carries on without it meanwhile.",
    lower_bound=0,
)
KERAS3 = flags.DEFINE_boolean(
    "keras3",
    False,
    "The command is a Keras 3 script on JAX (keras.distribution): the step is laid out as "
    "with --all_reduce, one process a task (tfconfig-slurm --explain --all_reduce shows it); "
    "each task gets KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID, which "
    "keras.distribution.initialize() reads with no arguments, KERAS_BACKEND=jax unless set, "
    "and JAX's CPU collectives on the task's own address.",
)
INDEPENDENT = flags.DEFINE_boolean(
    "independent",
    False,
    "With --keras3, the step's processes are meant to train apart: a script that never joins "
    "them (no keras.distribution.initialize()) is not refused. Without it, where a process "
    "of a step of several used Keras without joining the others, each trained a model "
    "of its own, and the task says so and ends with exit status 1.",
)
flags.adopt_module_key_flags(layout_flags)
flags.adopt_module_key_flags(model_dir_flag)
MODEL_DIR = model_dir_flag.MODEL_DIR


def main(argv: Sequence[str]) -> int:
    command = list(argv[1:])
    if not command:
        raise UsageError(
            "COMMAND", "missing: nothing to run", "srun launch/with-tfconfig python my_script.py"
        )
    layout, rank = _this_step_s_layout()
    environment = _task_environment(layout, rank)
    program = _program(command)
    task = layout.task(rank)
    if task.role != EVALUATOR:
        watchdog.check_port_free(f"{task.role} {task.index}", task.address)
    role = ClusterRole.from_json(environment["TF_CONFIG"])
    environment = {**os.environ, **environment}
    environment.update(_keras3_environment(role, environment) if KERAS3.value else {})
    owner, held = _run_held(command, role, task.node) if MODEL_DIR.value else (None, None)
    logging.info(
        "rank %d on %s is %s %d at %s with GPUs [%s]; running %s",
        rank,
        task.node,
        task.role,
        task.index,
        task.address,
        environment["CUDA_VISIBLE_DEVICES"],
        command[0],
    )
    status = _supervised(command, program, environment, role, owner)
    # A run done frees its directory. One stopped (for a requeue) or failed keeps it for its
    # job, as the runtime keeps its own: another job takes it over only once the lock has
    # gone stale, this process no longer renewing it.
    if held is not None and status == 0:
        held.release()
    return status


def _this_step_s_layout() -> tuple[ClusterLayout, int]:
    """The step's layout, as the flags and SLURM give it, and this task's rank in it."""
    if KERAS3.value:
        # Laid out as --all_reduce does: what would add other tasks than the processes of one
        # mesh is refused.
        for name in ("ps_per_node", "coordinator", "evaluator", "roles"):
            if flags.FLAGS[name].present:
                raise UsageError(
                    f"--{name}",
                    "lays out other tasks than trainers, and --keras3 runs one JAX process a "
                    "task, all of them training",
                    f"leave --{name} out: --keras3 lays the step out as --all_reduce does",
                )
        flags.FLAGS["all_reduce"].value = True
    elif INDEPENDENT.value:
        raise UsageError(
            "--independent",
            "is given without --keras3: only a Keras 3 step's processes are checked to have "
            "trained together",
            "add --keras3 for a Keras 3 script on JAX, or leave --independent out",
        )
    layout, rank = layout_flags.resolve_layout(os.environ)
    if rank is None:
        raise UsageError(
            "--nodelist",
            "plans a layout, so it cannot give a task its TF_CONFIG",
            "run inside a job step without --nodelist; to see a plan use tfconfig-slurm --explain",
        )
    place.warn_idle_gpus(layout)
    return layout, rank


def _task_environment(layout: ClusterLayout, rank: int) -> dict[str, str]:
    """The variables the task `rank` of `layout` runs with, its TF_CONFIG checked against one
    made for this step already and against the size exec passes."""
    environment = render.task_environment(layout, rank)
    tf_config = environment["TF_CONFIG"]
    given = place.given_tf_config(os.environ, layout.shape)
    if given is not None and given != tf_config and not OVERRIDE.value:
        raise UsageError(
            "TF_CONFIG",
            "is already set for this job step, to a different layout, and would be overwritten",
            f"unset TF_CONFIG, or pass --override to replace it: srun {PROGRAM} --override ...",
        )
    size = len("TF_CONFIG=") + len(tf_config.encode()) + 1
    if size > MAX_ENVIRONMENT_STRING:
        raise UsageError(
            "TF_CONFIG",
            f"is {size} bytes for {len(layout.roles)} tasks, more than the "
            f"{MAX_ENVIRONMENT_STRING} bytes Linux lets one environment string pass to exec",
            "compute it inside the training process, which needs no variable: "
            "tfconfig_slurm.cluster.read_slurm_step and lay_out_step, then "
            "tfconfig_slurm.cluster.render.tf_config; or start fewer tasks",
        )
    return environment


def _program(command: Sequence[str]) -> str:
    """The command's program, found; with --keras3, this environment's Python checked for
    Keras 3 and JAX (else the script fails in Keras or JAX, in a traceback on every task)."""
    program = shutil.which(command[0])
    if program is None:
        raise UsageError(
            repr(command[0]),
            "is not a program on PATH nor an executable file",
            "give the command as you would run it in the task, e.g. python my_script.py",
        )
    # Only a Python of the environment this command runs in (its bin folder's) has its packages.
    path = Path(program).absolute()
    ours = path.name.startswith("python") and path.parent == Path(sys.executable).absolute().parent
    if KERAS3.value and ours:
        versions.require_keras3("--keras3")
    return program


def _supervised(
    command: Sequence[str],
    program: str,
    environment: dict[str, str],
    role: ClusterRole,
    owner: RunOwner | None,
) -> int:
    """The command started and supervised as `role`'s task to its end; its exit status."""
    with _jax_notes(role, environment) as notes:
        group = supervise.command_group(
            RunDir(model_dir_flag.made()).native_end(role.task_id) if MODEL_DIR.value else None
        )
        try:
            group.start(command, environment, program=program)
        except OSError as error:
            raise UsageError(
                repr(command[0]),
                f"cannot be run ({error.strerror})",
                "give a program on PATH or a path to an executable file",
            ) from None
        with _port_answered(role):
            status = supervise.supervise(
                group, role, owner, WORKER_RESTARTS.value, keras_3=KERAS3.value
            )
        if status == 0 and _trained_apart(role, notes):
            status = 1
    return status


def _port_answered(role: ClusterRole) -> contextlib.AbstractContextManager[object]:
    """Nothing of JAX's listens on a --keras3 worker's port (its service is on the chief's):
    the supervisor answers there for the command's watchers. On a --keras3 chief's, JAX's
    service does, until it shuts down at the script's exit: the supervisor answers from then
    (watchdog.once_free). Another command's own server answers on its port."""
    if KERAS3.value and role.role != CHIEF:
        return watchdog.answering(role)
    if KERAS3.value and role.trainers > 1:
        return watchdog.once_free(role)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _jax_notes(role: ClusterRole, environment: dict[str, str]) -> Iterator[Path | None]:
    """A file the command's Pythons note in whether they joined the step's processes
    (boot/sitecustomize.py), named in `environment`, for a --keras3 step of several
    processes not said to be --independent; removed after. None where none is kept."""
    if not KERAS3.value or INDEPENDENT.value or role.trainers < 2:
        yield None
        return
    descriptor, name = tempfile.mkstemp(prefix="tfconfig-slurm-jax-notes-")
    os.close(descriptor)
    environment[boot.NOTES_VARIABLE] = name
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _trained_apart(role: ClusterRole, notes: Path | None) -> bool:
    """Whether the command used Keras in this task and never joined the step's processes:
    said in one line."""
    said = set(notes.read_text().split()) if notes is not None else set()
    if boot.ALONE not in said or boot.JOINED in said:
        return False
    logging.error(
        "%s %d: its command used Keras without joining the step's %d processes, so each trained "
        "a model of its own (exit 1). HINT: before building the model, add "
        "keras.distribution.initialize() and keras.distribution.set_distribution("
        "keras.distribution.DataParallel(auto_shard_dataset=False)), and fit each process's "
        "share of the data (x[jax.process_index()::jax.process_count()], batch_size per "
        "process); or pass --independent where separate models are meant",
        role.role,
        role.index,
        role.trainers,
    )
    return True


def _keras3_environment(role: ClusterRole, environment: Mapping[str, str]) -> dict[str, str]:
    """A --keras3 command's own variables: keras.distribution's, its backend (unless set),
    JAX's (backends/keras3/boot), and the boot folder first on its PYTHONPATH, which puts
    JAX's CPU collectives on the task's own address."""
    backend = environment.get("KERAS_BACKEND", "jax")
    if backend != "jax":
        logging.warning(
            "KERAS_BACKEND=%s: kept, as it is set; keras.distribution runs across processes "
            "on JAX only, so the command may fail. HINT: unset it, or export KERAS_BACKEND=jax",
            backend,
        )
    path = [str(boot.FOLDER), *filter(None, [environment.get("PYTHONPATH")])]
    return {
        **role.keras_distribution(),
        **boot.jax_variables(role.address.rpartition(":")[0], environment["CUDA_VISIBLE_DEVICES"]),
        "KERAS_BACKEND": backend,
        "PYTHONPATH": os.pathsep.join(path),
    }


def _run_held(
    command: Sequence[str], role: ClusterRole, node: str
) -> tuple[RunOwner | None, claim.Claim | None]:
    """--model_dir made and held, as the runtime holds its own: two jobs' scripts would resume
    each other's checkpoints, and their state.json would be one. Failures are recorded there,
    and the chief says in it how the run goes."""
    directory = model_dir_flag.made()
    job = read_slurm_job(os.environ)
    # The script it runs is its experiment.
    script = Path(next((word for word in command[1:] if word.endswith(".py")), command[0])).name
    # Refused before anything is written there: another live run's, then another script's.
    same_experiment = functools.partial(
        history.check_same_experiment, directory, script, _NAMING, scripts_share=True
    )
    _, held = claim.claimed(directory, role, _NAMING, job, same_experiment)
    failure.attach(directory, role, node)
    return (RunOwner.in_job(directory, script, {}, role, job) if owns_run(role) else None), held


# How --model_dir is named in a refusal of a directory another run holds.
_NAMING = claim.Naming(
    "--model_dir",
    "--model_dir=/scratch/$USER/runs/lr5e-4",
    "--model_dir",
    "give this run a --model_dir of its own",
)


def run() -> None:
    run_cli(PROGRAM, main, stop_at_first_argument=True, logs=True)


if __name__ == "__main__":
    run()

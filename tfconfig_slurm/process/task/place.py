"""Where this process trains: the task a TF_CONFIG gives it, its task in a SLURM step's layout,
or a single process. No TensorFlow. Finding the place changes nothing: the door that found it
sets the task's variables (Place.set_in) before TensorFlow looks at its devices.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from absl import logging

from tfconfig_slurm.cluster import ClusterLayout, LayoutPolicy, StepShape, render
from tfconfig_slurm.cluster import role as role_lib
from tfconfig_slurm.cluster.layout import PS, lay_out_step
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.cluster.step import in_job_step, read_slurm_step
from tfconfig_slurm.errors import TfconfigSlurmError, UsageError

# The layout policy of a process without flags (a script calling the API): a variable a flag.
POLICY_VARIABLES = {
    "--ps_per_node": "TFCONFIG_SLURM_PS_PER_NODE",
    "--roles": "TFCONFIG_SLURM_ROLES",
    "--evaluator": "TFCONFIG_SLURM_EVALUATOR",
    "--address_template": "TFCONFIG_SLURM_ADDRESS_TEMPLATE",
    "--port_base": "TFCONFIG_SLURM_PORT_BASE",
    "--all_reduce": "TFCONFIG_SLURM_ALL_REDUCE",
    "--coordinator": "TFCONFIG_SLURM_COORDINATOR",
}
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no", "")

# A process without CUDA_VISIBLE_DEVICES: TensorFlow takes every GPU it finds.
_ANY_GPUS = "any"


class Place(NamedTuple):
    """This process's task, and what to say about it in its first log line."""

    # None for a single process.
    role: ClusterRole | None
    node: str
    gpus: str
    # Which setting chose the layout, for an error about it: "TF_CONFIG" when it was given.
    layout_source: str
    # Whether SLURM bound this task to CPUs of its own, which it then shares with no task.
    own_cpus: bool = False
    # The variables the task's process takes (render.task_environment's, in a step); None
    # unsets one: a TF_CONFIG set aside, which TensorFlow's own resolvers would read.
    environment: Mapping[str, str | None] = MappingProxyType({})

    def set_in(self, environ: MutableMapping[str, str], *, tf_config: bool = True) -> None:
        """Sets the task's variables in `environ`, the door's own process environment, where
        TensorFlow reads them. Without `tf_config`, for a resolver that carries the cluster
        itself, a TF_CONFIG stays only where it was given."""
        for name, value in self.environment.items():
            if value is None or (name == "TF_CONFIG" and not tf_config):
                environ.pop(name, None)
            else:
                environ[name] = value

    @property
    def gpu_ids(self) -> tuple[str, ...] | None:
        """This task's GPUs by their ids; None where it takes whatever its framework finds."""
        return None if self.gpus == _ANY_GPUS else tuple(filter(None, self.gpus.split(",")))

    def log_start(self, model_dir: Path, resumed: int | None, *details: str) -> None:
        """The task's first line, the same for every backend: who and where it is, its GPUs,
        its model directory, and the checkpoint step it resumes from."""
        where = f"a single process on {self.node}"
        if self.role:
            where = f"{self.role.task_id} on {self.node} at {self.role.address}"
        start = f"resuming from step {resumed}" if resumed else "starting at step 0"
        logging.info(
            "%s with %s, model directory %s, %s",
            where,
            "whatever GPUs it finds" if self.gpus == _ANY_GPUS else f"GPUs [{self.gpus}]",
            model_dir,
            "; ".join((start, *details)),
        )


def warn_idle_gpus(layout: ClusterLayout) -> None:
    """Logs the warning of GPUs that no task of `layout` uses, if any."""
    warning = render.idle_gpus_warning(layout)
    if warning:
        logging.warning("%s", warning)


def find(environ: Mapping[str, str], policy: LayoutPolicy, policy_source: str) -> Place:
    """This process's place, from `environ`; in a step, with the task's environment to set.

    A TF_CONFIG given to this task wins (see given_tf_config); otherwise, inside a SLURM step of
    several tasks, `policy` lays the step out (`policy_source` names its settings in errors).
    """
    gpus = environ.get("CUDA_VISIBLE_DEVICES", _ANY_GPUS)
    step = read_slurm_step(environ) if in_job_step(environ) else None
    # SLURM's name of the node where it gives one; else uname's, gethostname's without
    # importing socket (a login node's tools start fast).
    node = (step.node_name if step else None) or os.uname().nodename
    given = given_tf_config(environ, step.shape if step else None)
    if given is not None:
        role = ClusterRole.from_json(given)
        return Place(role, node, "" if role.role == PS else gpus, "TF_CONFIG")
    if step is None or step.shape.num_tasks == 1:
        return Place(None, node, gpus, policy_source, environment={"TF_CONFIG": None})
    layout = lay_out_step(step, policy)
    warn_idle_gpus(layout)
    environment = render.task_environment(layout, step.rank)
    role = ClusterRole.from_json(environment["TF_CONFIG"])
    gpus = environment["CUDA_VISIBLE_DEVICES"]
    return Place(role, layout.task(step.rank).node, gpus, policy_source, step.own_cpus, environment)


def given_tf_config(environ: Mapping[str, str], shape: StepShape | None) -> str | None:
    """The TF_CONFIG this process was given, or None.

    Inside a job step (`shape`) only one made for this very step counts (or a --local_cluster
    task's): sbatch and srun pass the submitting shell's environment on, and a TF_CONFIG left
    there describes another cluster. It is set aside with one warning.
    """
    text = environ.get("TF_CONFIG")
    if text is None or shape is None:
        return text
    run = role_lib.run_of(text)
    if run is not None and (run == shape.run_id or run.startswith(role_lib.LOCAL_RUN_PREFIX)):
        return text
    logging.warning(
        "TF_CONFIG: set, but made %s, so it was inherited from the shell that submitted the "
        "job; this task ignores it and takes its place in job step %d.%d from SLURM. HINT: "
        "unset TF_CONFIG before sbatch or srun",
        f"for another run ({run})" if run else "elsewhere, not by tfconfig-slurm for this step",
        shape.job_id,
        shape.step_id,
    )
    return None


def servers_flag(policy: LayoutPolicy) -> str:
    """The flag that set how many parameter servers the policy's layout has, for errors."""
    if policy.coordinator:
        return "--coordinator"
    return "--all_reduce" if policy.all_reduce else "--ps_per_node"


def policy_from_environ(environ: Mapping[str, str]) -> LayoutPolicy:
    """The layout policy the TFCONFIG_SLURM_* variables set; a default for each one unset."""
    values: dict[str, object] = {}
    for flag, variable in POLICY_VARIABLES.items():
        text = environ.get(variable)
        if text is not None:
            values[flag[2:]] = _parse(flag, variable, text.strip())
    try:
        return LayoutPolicy(**values)  # type: ignore[arg-type]
    except UsageError as error:
        raise in_variables(error) from None


def in_variables(error: TfconfigSlurmError) -> TfconfigSlurmError:
    """The error with a layout flag it names renamed to the TFCONFIG_SLURM_* variable setting it."""
    variable = POLICY_VARIABLES.get(error.culprit)
    if variable is None:
        return error
    # The hint's example too: "e.g. --roles=ps,worker" would be a flag the process lacks.
    hint = error.hint.replace(f"{error.culprit}=", f"{variable}=")
    return type(error)(variable, error.problem, hint)


# A value each numeric variable accepts, for the hint (a port base is from 1024 up).
_NUMBER_EXAMPLES = {"--ps_per_node": "1", "--port_base": "20000"}


def _parse(flag: str, variable: str, text: str) -> object:
    if flag == "--roles":
        return tuple(role.strip() for role in text.split(",") if role.strip()) or None
    if flag in ("--evaluator", "--all_reduce", "--coordinator"):
        if text.lower() not in _TRUE + _FALSE:
            raise UsageError(
                variable,
                f"is {text!r}, expected 1, true or yes, or 0, false, no or empty",
                f"e.g. {variable}=1",
            )
        return text.lower() in _TRUE
    if flag in _NUMBER_EXAMPLES:
        try:
            return int(text)
        except ValueError:
            raise UsageError(
                variable,
                f"is {text!r}, expected a whole number",
                f"e.g. {variable}={_NUMBER_EXAMPLES[flag]}",
            ) from None
    return text

"""JAX's CPU collectives (gloo) on a given address.

JAX's public API leaves gloo to advertise whatever the machine's hostname resolves to:
127.0.0.1 on hosts with Debian's `127.0.1.1 <hostname>` line and on the test cluster's nodes,
where every connection between nodes was refused (../shared/reference/KERAS3_FACTS.md). The
CPU backend is therefore registered here again, through JAX's own factory, with gloo told the
address. That uses JAX's internal modules (jax._src), and only those: a user's script may be
importing jax as this runs (boot/sitecustomize.py). A JAX that changes them is refused in one
line.
"""

from __future__ import annotations

from typing import Any

from tfconfig_slurm.errors import InstallError, UsageError


def on(host: str) -> None:
    """JAX's CPU backend, made on first use, with gloo on `host`."""
    try:
        from jax._src import distributed, xla_bridge  # noqa: PLC0415
        from jax._src.lib import _jax  # noqa: PLC0415

        make_client, register = xla_bridge.make_cpu_client, xla_bridge.register_backend_factory
        make_gloo = _jax.make_gloo_tcp_collectives
    except (ImportError, AttributeError) as error:
        raise InstallError(
            "JAX",
            f"lacks the internal function tfconfig-slurm gives gloo its address with ({error})",
            "install a JAX tfconfig-slurm was tried with, 0.8.2 to 0.12 (pip install "
            "'jax>=0.8.2,<0.13')",
        ) from None

    if xla_bridge.backends_are_initialized():
        raise UsageError(
            "tfconfig_slurm.keras_distribution()",
            "was called after JAX made its backends, so its CPU collectives can no longer be "
            "put on this task's address",
            "call it first, before anything uses Keras or JAX",
        )

    def cpu_client() -> Any:
        if distributed.global_state.client is None:
            # One process: no collectives across processes to make.
            return make_client()
        gloo = make_gloo(distributed_client=distributed.global_state.client, hostname=host)
        return make_client(collectives=gloo)

    register("cpu", cpu_client, priority=0, fail_quietly=False)

"""What a task checks of the network before its command starts a server: every peer's address
resolves, and its own port is free. TensorFlow says neither well: a peer whose name does not
resolve looks like one that never answers (given timing.START_SECONDS to start), and a server
on a busy port (gRPC binds without SO_REUSEPORT) dies with `UnknownError: Could not start gRPC
server`."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import UsageError


def check_task(role: ClusterRole) -> None:
    """Both checks, for a runtime task about to start its server in `role`'s cluster
    (with-tfconfig checks only the port: its command may reach its peers some other way)."""
    check_addresses_resolve(role.named(CHIEF, PS, WORKER))
    if role.role != EVALUATOR:
        check_port_free(str(role.task_id), role.address)


def check_addresses_resolve(peers: Mapping[str, str]) -> None:
    """Raises UsageError naming the first peer whose host does not resolve."""
    checked: set[str] = set()
    for name, address in peers.items():
        host = address.rpartition(":")[0]
        if host in checked:
            continue
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as error:
            reason = error.strerror if isinstance(error, socket.gaierror) else str(error)
            raise UsageError(
                "--address_template",
                f"gives {name} the address {host!r}, which does not resolve here ({reason})",
                "a task's address is its node's name through --address_template (default "
                "'{node}'); pick a pattern every node resolves, e.g. check with getent hosts "
                f"{host}",
            ) from None
        checked.add(host)


def check_port_free(name: str, address: str) -> None:
    """Raises UsageError when this task's port is already taken on this machine."""
    port = int(address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # An earlier task's connections in TIME_WAIT do not make the port busy; a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            # As gRPC's server binds: every interface.
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            raise UsageError(
                "--port_base",
                f"gives {name} port {port}, which another process on this node already uses "
                f"({error.strerror})",
                "another job or step on the node holds it: pass --port_base=N with a free "
                f"block of ports, e.g. see ss -ltnp 'sport = :{port}'",
            ) from None

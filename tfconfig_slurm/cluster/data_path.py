"""What a parameter-server layout asks of each node's network per training step, before a job
is submitted: `--explain --model_bytes=...`. Pure: no TensorFlow, no I/O.

Each step every trainer reads all the variables (M bytes, dense) from the parameter servers and
sends them its gradients; a node whose parameter servers hold a share S of the variables so
moves, each way,

    T_n * M * (1 - S)       its own T_n trainers, to and from the other nodes' servers
  + (T - T_n) * M * S       its servers, to and from the other nodes' T - T_n trainers

One trainer a node that drives all its GPUs (`--coordinator`) sums their gradients first.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from tfconfig_slurm.cluster.layout import PS, ClusterLayout, trainer_roles
from tfconfig_slurm.errors import UsageError

# 25 Gbit/s Ethernet, common on GPU nodes' second network (InfiniBand HDR gives 200).
DEFAULT_GBITS_PER_SECOND = 25.0
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)", re.IGNORECASE)


class DataPath(NamedTuple):
    """The busiest node's traffic each step, each way, and what one trainer a node would move."""

    node: str
    bytes_each_way: float
    # With each node's trainers as one that drives all its GPUs; None where it has one already.
    one_trainer_a_node: float | None

    def seconds(self, gbits_per_second: float) -> float:
        return self.bytes_each_way * 8 / (gbits_per_second * 1e9)


def parse_bytes(text: str) -> int:
    """`13MB`, `3.3e6`, `1.5GiB`, `420000000` as bytes (--model_bytes); UsageError else."""
    found = _SIZE.fullmatch(text.strip())
    try:
        number = float(text) if found is None else float(found.group(1))
    except ValueError:
        raise UsageError(
            "--model_bytes",
            f"is {text!r}, expected a size such as 13MB, 1.5GiB or 420000000",
            "give the size of the model's dense variables (4 bytes a float32 parameter)",
        ) from None
    unit = "" if found is None else found.group(2).lower()
    # KiB, MiB, GiB, TiB: powers of 1024.
    scale = (1024 if "i" in unit else 1000) ** ("kmgt".find(unit[:1]) + 1 if unit else 0)
    if not math.isfinite(number * scale):
        raise UsageError("--model_bytes", f"is {text!r}, expected a finite size", "e.g. 13MB")
    size = int(number * scale)
    if size <= 0:
        raise UsageError("--model_bytes", f"is {text!r}, expected more than 0 bytes", "e.g. 13MB")
    return size


def data_path(layout: ClusterLayout, model_bytes: int) -> DataPath | None:
    """The busiest node's traffic per step; None for a layout without parameter servers (its
    all-reduce moves what its collective's algorithm moves)."""
    trainers = layout.placement.per_node(layout.roles, trainer_roles(layout.coordinator))
    servers = layout.placement.per_node(layout.roles, (PS,))
    total_trainers, total_servers = sum(trainers.values()), sum(servers.values())
    if not total_servers or not total_trainers:
        return None

    def each_way(node: int, trainers_on: int, everyone: int) -> float:
        share = servers[node] / total_servers
        return trainers_on * model_bytes * (1 - share) + (everyone - trainers_on) * (
            model_bytes * share
        )

    busiest = max(
        range(len(layout.shape.nodes)),
        key=lambda node: each_way(node, trainers[node], total_trainers),
    )
    moved = each_way(busiest, trainers[busiest], total_trainers)
    alone = None
    if max(trainers.values()) > 1:
        nodes_training = len(trainers)
        alone = max(
            each_way(node, 1 if trainers[node] else 0, nodes_training)
            for node in range(len(layout.shape.nodes))
        )
    return DataPath(layout.shape.nodes[busiest], moved, alone)


def describe(path: DataPath, gbits_per_second: float, gbits_given: bool) -> str:
    """One line for --explain."""
    if not path.bytes_each_way:
        return (
            f"data path: the parameter servers and trainers are all on {path.node}: no step "
            "crosses the network"
        )
    took = _three_figures(path.seconds(gbits_per_second) * 1e9, ("ns", "us", "ms", "s"))
    speed = f"{gbits_per_second:g} Gbit/s" + ("" if gbits_given else " (--link_gbits; a guess)")
    line = (
        f"data path: each step {path.node} sends and receives {_size(path.bytes_each_way)} each "
        f"way to the parameter servers and trainers of other nodes, {took} at {speed}"
    )
    if path.one_trainer_a_node is not None:
        factor = path.bytes_each_way / max(path.one_trainer_a_node, 1.0)
        line += (
            f"; one trainer a node that sums its GPUs' gradients first (ParameterServerStrategy, "
            f"--coordinator) would move {_size(path.one_trainer_a_node)}, {factor:.3g}x less"
        )
    return line


def _size(size: float) -> str:
    # From bytes up: a size of a few bytes (a --model_bytes of 13 meant as 13 MB) said as 0 MB
    # would hide the slip.
    return _three_figures(size, ("bytes", "kB", "MB", "GB", "TB", "PB"))


def _three_figures(value: float, units: tuple[str, ...]) -> str:
    """`value` of the first unit in the largest unit it reaches (each 1000 of the one before), to
    3 significant figures, never in exponent notation."""
    nth = 0
    while nth < len(units) - 1 and float(f"{value:.3g}") >= 1000:
        value, nth = value / 1000, nth + 1
    unit = units[nth]
    text = f"{value:.3g}"
    return f"{float(text):,.0f} {unit}" if "e" in text else f"{text} {unit}"

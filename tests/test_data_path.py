"""What a parameter-server layout asks of each node's network per step (--explain
--model_bytes): the formula on layouts of the core, and the command's bad input."""

from __future__ import annotations

import pytest

from tests.cli import run_module
from tests.slurm_envs import captured, task_env
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step
from tfconfig_slurm.cluster.data_path import data_path, describe, parse_bytes
from tfconfig_slurm.errors import UsageError

M = 13_000_000


def layout_of(environ: dict[str, str], policy: LayoutPolicy | None = None):  # type: ignore[no-untyped-def]
    return lay_out_step(read_slurm_step(environ), policy or LayoutPolicy())


def test_alike_nodes_move_2gm_n_minus_1_over_n_and_one_trainer_a_node_g_times_less() -> None:
    """4 nodes, a ps and 4 trainers each: 2 x 4 x M x 3/4 each way; as one trainer a node,
    4 times less."""
    layout = layout_of(task_env(["a", "b", "c", "d"], [5] * 4, 0, gpus="0,1,2,3"))
    path = data_path(layout, M)
    assert path is not None
    assert path.bytes_each_way == pytest.approx(2 * 4 * M * 3 / 4)
    assert path.one_trainer_a_node == pytest.approx(2 * 1 * M * 3 / 4)
    assert path.seconds(100.0) == pytest.approx(2 * 4 * M * 3 / 4 * 8 / 100e9)


def test_a_heterogeneous_job_s_cpu_node_holds_every_ps_and_carries_every_trainer() -> None:
    """Its one CPU node runs both parameter servers: every trainer's M crosses its link."""
    layout = layout_of(captured("het_srun_1cpu_2x2gres2", "task-0"))
    path = data_path(layout, M)
    trainers = sum(role in ("chief", "worker") for role in layout.roles)
    assert path is not None and path.node == layout.shape.nodes[0]
    assert path.bytes_each_way == pytest.approx(trainers * M)


def test_a_coordinator_s_workers_already_drive_their_node_s_gpus() -> None:
    layout = layout_of(task_env(["a", "b"], [3, 2], 0, gpus="0,1"), LayoutPolicy(coordinator=True))
    path = data_path(layout, M)
    assert path is not None and path.one_trainer_a_node is None
    assert path.bytes_each_way == pytest.approx(2 * 1 * M * 1 / 2)


def test_one_node_moves_nothing_and_says_so() -> None:
    layout = layout_of(task_env(["a"], [3], 0, gpus="0,1"))
    path = data_path(layout, M)
    assert path is not None and path.bytes_each_way == 0
    assert describe(path, 25.0, False) == (
        "data path: the parameter servers and trainers are all on a: no step crosses the network"
    )


def test_an_all_reduce_layout_has_no_ps_estimate() -> None:
    layout = layout_of(task_env(["a", "b"], [2, 2], 0, gpus="0,1"), LayoutPolicy(all_reduce=True))
    assert data_path(layout, M) is None


@pytest.mark.parametrize(
    ("text", "size"),
    [("13MB", 13_000_000), ("13M", 13_000_000), ("1.5GiB", 3 << 29), ("420", 420),
     ("3.3e6", 3_300_000), ("2 KiB", 2048)],
)  # fmt: skip
def test_sizes_read_as_people_write_them(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["13X", "", "-5MB", "0", "1e400", "inf", "nan", "infMB"])
def test_a_size_that_is_none_names_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_bytes(text)
    assert raised.value.culprit == "--model_bytes"


@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        (("--model_bytes=13MB",), "--model_bytes: goes with the --explain table"),
        (("--explain", "--json", "--model_bytes=13MB"), "--model_bytes: goes with the"),
        (("--explain", "--link_gbits=100"), "--link_gbits: goes with --model_bytes"),
        (("--explain", "--model_bytes=1MB", "--link_gbits=0"), "--link_gbits: is 0, expected a"),
        (("--explain", "--model_bytes=1MB", "--link_gbits=nan"), "--link_gbits: is nan, expected"),
        (("--explain", "--model_bytes=1MB", "--link_gbits=inf"), "--link_gbits: is inf, expected"),
        (("--explain", "--model_bytes=1e400"), "--model_bytes: is '1e400', expected a finite"),
    ],
)
def test_the_data_path_flags_refused_out_of_place(flags: tuple[str, ...], culprit: str) -> None:
    result = run_module("tfconfig_slurm.tfconfig", "--nodelist=gpu[01-02]", *flags)
    assert result.returncode == 2
    assert result.stderr.startswith(f"tfconfig-slurm: {culprit}"), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("model_bytes", "each_way", "seconds", "one_trainer_a_node"),
    [
        ("13MB", "205 MB", "65.5 ms", "25.6 MB"),
        # In plain figures, never in exponent notation (it said 1.58e+04 MB, 5.04e+03 ms).
        ("1GB", "15.8 GB", "5.04 s", "1.97 GB"),
        # From bytes up: 13 (meant as 13 MB) had said 0 MB and 0 ms.
        ("13", "205 bytes", "65.5 ns", "25.6 bytes"),
    ],
)
def test_the_explain_table_says_the_data_path_and_the_layout_that_moves_less(
    model_bytes: str, each_way: str, seconds: str, one_trainer_a_node: str
) -> None:
    result = run_module(
        "tfconfig_slurm.tfconfig", "--explain", "--nodelist=gpu[01-64]", "--gpus_per_node=8",
        f"--model_bytes={model_bytes}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        f"data path: each step gpu01 sends and receives {each_way} each way to the parameter "
        f"servers and trainers of other nodes, {seconds} at 25 Gbit/s (--link_gbits; a guess); "
        "one trainer a node that sums its GPUs' gradients first (ParameterServerStrategy, "
        f"--coordinator) would move {one_trainer_a_node}, 8x less"
    ) in result.stdout

"""A task's start checks: a busy port and a name that does not resolve are one line each."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests import fake_backend
from tests.cli import PACED, free_port_block, run_module
from tests.slurm_envs import task_env
from tfconfig_slurm.errors import UsageError
from tfconfig_slurm.process.supervision.watchdog import check_addresses_resolve, check_port_free


def _listening() -> socket.socket:
    holder = socket.socket()
    # As gRPC's servers do; the connections they leave in TIME_WAIT keep it.
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_port_another_process_listens_on_is_refused() -> None:
    with _listening() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(UsageError) as raised:
            check_port_free("ps 0", f"node1:{port}")
    assert raised.value.culprit == "--port_base"
    assert f"gives ps 0 port {port}, which another process" in raised.value.problem


def test_a_port_left_in_time_wait_by_an_earlier_task_is_free() -> None:
    with _listening() as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        # The side that closes first keeps the port in TIME_WAIT.
        accepted.close()
        client.close()
    check_port_free("ps 0", f"node1:{port}")


def test_a_name_that_does_not_resolve_is_refused_by_name() -> None:
    with pytest.raises(UsageError) as raised:
        check_addresses_resolve({"chief 0": "localhost:1", "ps 1": "gpu02-ib0.invalid:10000"})
    assert raised.value.culprit == "--address_template"
    assert "gives ps 1 the address 'gpu02-ib0.invalid', which does not resolve" in (
        raised.value.problem
    )


def _tf_config(ps: str, chief: str) -> str:
    return json.dumps(
        {"cluster": {"chief": [chief], "ps": [ps]}, "task": {"type": "ps", "index": 0}}
    )


@pytest.mark.parametrize("problem", ["busy port", "unresolvable"])
def test_the_runtime_stops_at_once_with_one_line(tmp_path: Path, problem: str) -> None:
    with _listening() as holder:
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        tf_config = (
            _tf_config(ps=busy, chief="127.0.0.1:1")
            if problem == "busy port"
            else _tf_config(ps="127.0.0.1:1", chief="nowhere.invalid:1")
        )
        result = run_module(
            "tfconfig_slurm.run",
            "--experiment=mnist_deep",
            f"--output_root={tmp_path}",
            environ={"TF_CONFIG": tf_config},
        )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    culprit = "--port_base" if problem == "busy port" else "--address_template"
    assert result.stderr.startswith(f"tfconfig-slurm-run: {culprit}: ")
    assert not (tmp_path / "mnist_deep").exists()


def test_a_task_of_a_step_refused_its_port_is_the_run_s_first_failure(tmp_path: Path) -> None:
    """Its peers, whose ports are free, would otherwise record it lost once it has gone: a
    newcomer's runs table said the chief was killed."""
    environ = {**task_env(["localhost"], [2], 1), **fake_backend.environ()}
    flags = (
        f"--experiment={PACED}",
        f"--output_root={tmp_path}",
        f"--port_base={free_port_block(4)}",
    )
    shown = run_module("tfconfig_slurm.tfconfig", *flags[2:], environ=environ)
    config = json.loads(shown.stdout)
    assert config["task"] == {"type": "chief", "index": 0}, shown.stderr
    port = int(config["cluster"]["chief"][0].rpartition(":")[2])
    with socket.create_server(("0.0.0.0", port)):
        result = run_module("tfconfig_slurm.run", *flags, environ=environ)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith("tfconfig-slurm-run: --port_base: gives chief 0 port ")
    (record,) = (tmp_path / "paced" / "failures").glob("4242.0.0.json")
    first = json.loads(record.read_text())
    assert (first["task"], first["exit_status"], first["seen_by"]) == ("chief 0", 2, None)
    assert first["what"].startswith("--port_base: gives chief 0 port "), first
    # The job was refused at its start, as its refusal says (its record too): not failed.
    table = run_module("tfconfig_slurm.commands", "runs", str(tmp_path), "--json")
    (run,) = json.loads(table.stdout)
    assert (run["state"], run["job_id"], run["refused"]["line"]) == (
        "refused",
        "4242",
        result.stderr.strip().removeprefix("tfconfig-slurm-run: "),
    ), run

"""The watchdog: a peer whose port stops answering is lost, one that was released is not."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli import free_port_block, wait_until
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import ExitStatus
from tfconfig_slurm.process import exits
from tfconfig_slurm.process.records import failure
from tfconfig_slurm.process.supervision import watchdog
from tfconfig_slurm.process.supervision.watchdog import PeerWatch

FAST: dict[str, Any] = {"lost_after": 0.3, "probe_seconds": 0.05}
# Far longer than any loss takes with FAST: a test waits this long only when it fails.
PATIENCE = 10.0


class Lost:
    """Records each loss as the watch reports it."""

    def __init__(self) -> None:
        self.reported: list[tuple[str, str]] = []
        self.event = threading.Event()

    def __call__(self, name: str, address: str, silent_for: float) -> None:
        self.reported.append((name, address))
        self.event.set()


@pytest.fixture
def listener() -> Iterator[tuple[socket.socket, str]]:
    server = socket.create_server(("127.0.0.1", 0))
    yield server, f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_a_peer_that_stops_listening_is_lost_and_named(
    listener: tuple[socket.socket, str],
) -> None:
    server, address = listener
    lost = Lost()
    watch = PeerWatch({"ps 1": address}, on_lost=lost, **FAST)
    try:
        assert not lost.event.wait(1.0)  # alive: answering
        server.close()
        assert lost.event.wait(PATIENCE)
    finally:
        watch.stop()
    assert lost.reported == [("ps 1", address)]


def test_once_the_run_has_failed_a_silent_peer_is_lost_at_its_first_unanswered_probe(
    listener: tuple[socket.socket, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer that ended because the run failed is not waited for: the chain of watchers
    that ends a job ends in one probe a link, not one grace period (3 s) a link."""
    monkeypatch.setattr(failure._TASK, "attached", None)
    cluster = {"ps": ("node1:2223",), "worker": ("node2:2222",)}
    failure.attach(
        tmp_path, ClusterRole(cluster=cluster, role="ps", index=0, run_id="7.0.0"), "node1"
    )
    server, address = listener
    lost = Lost()
    watch = PeerWatch({"worker 0": address}, on_lost=lost, lost_after=PATIENCE, probe_seconds=0.05)
    try:
        assert not lost.event.wait(0.5)  # answering
        assert failure.record_lost("chief 0", "node3:2222", "stopped answering") is None
        server.close()
        assert lost.event.wait(PATIENCE / 2)
    finally:
        watch.stop()
    assert lost.reported == [("worker 0", address)]


def test_a_released_peer_may_leave(listener: tuple[socket.socket, str]) -> None:
    server, address = listener
    lost = Lost()
    watch = PeerWatch({"worker 0": address}, on_lost=lost, **FAST)
    watch.release("worker 0")
    server.close()
    assert not lost.event.wait(1.0)
    watch.stop()
    assert lost.reported == []


def test_a_peer_that_never_starts_is_lost_after_the_start_allowance() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening
        lost = Lost()
        watch = PeerWatch({"chief 0": address}, on_lost=lost, start_seconds=0.5, **FAST)
        assert lost.event.wait(PATIENCE)
        watch.stop()
    assert lost.reported == [("chief 0", address)]


def test_a_peer_that_never_started_is_not_lost_within_the_allowance() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        lost = Lost()
        watch = PeerWatch({"chief 0": f"127.0.0.1:{probe.getsockname()[1]}"}, on_lost=lost, **FAST)
        assert not lost.event.wait(1.0)
        watch.stop()
    assert lost.reported == []


def test_a_peer_that_says_it_finished_is_released_not_lost(
    listener: tuple[socket.socket, str],
) -> None:
    """As a trainer under with-tfconfig says so on its port once its command exits 0."""
    server, address = listener
    # A gRPC server first sends a frame of its own; the finished trainer, FINISHED.
    answer = [b"\x00\x00\x18\x04"]

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), connection:
                connection.sendall(answer[0])

    threading.Thread(target=serve, daemon=True).start()
    lost, finished = Lost(), threading.Event()
    names: list[str] = []

    def on_finished(name: str) -> None:
        names.append(name)
        finished.set()

    watch = PeerWatch({"worker 0": address}, on_lost=lost, on_finished=on_finished, **FAST)
    try:
        assert not finished.wait(0.5)
        answer[0] = watchdog.FINISHED
        assert finished.wait(PATIENCE)
        server.close()
        assert not lost.event.wait(1.0)
    finally:
        watch.stop()
    assert names == ["worker 0"]


class EndedError(Exception):
    """exits.end_now, in a test: the status the process would have ended with."""


def test_a_failed_collective_names_a_peer_whose_port_refuses_the_error_s_host_first(
    listener: tuple[socket.socket, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only the watched ones, and not after the watch's grace; the peer the error names
    comes first, and is the run's recorded failure."""
    _, alive = listener
    # Two ports nothing listens on, on two loopback addresses.
    refused = []
    for host in ("127.0.0.1", "127.0.0.2"):
        closed = socket.create_server((host, 0))
        refused.append(f"{host}:{closed.getsockname()[1]}")
        closed.close()
    monkeypatch.setattr(failure._TASK, "attached", None)
    cluster = {"chief": (alive,), "worker": (refused[0], refused[1], "127.0.0.1:1")}
    failure.attach(
        tmp_path, ClusterRole(cluster=cluster, role="worker", index=2, run_id="7.0.0"), "node3"
    )

    def end_now(status: int, reason: str) -> None:
        raise EndedError(status)

    monkeypatch.setattr(exits, "end_now", end_now)
    others = {"chief 0": alive, "worker 0": refused[0], "worker 1": refused[1]}
    watch = PeerWatch({"chief 0": alive}, others=others, lost_after=PATIENCE)
    try:
        with pytest.raises(EndedError) as ended:
            watch.end_for_a_lost_peer(f"all-reduce failed: closed by peer [{refused[1]}]")
    finally:
        watch.stop()
    assert ended.value.args == (ExitStatus.PEER_LOST,)
    first = failure.read(tmp_path, "7.0.0")
    assert first is not None and first.task == "worker 1", first
    assert first.what == watchdog.REFUSED.recorded
    # A host named as the error's address resolves back to: one lookup, not one a host.
    named = watchdog._named_hosts(["localhost:1", "elsewhere:2"], "closed by peer [127.0.0.1]:5")
    assert named == {"localhost"}


def test_a_failed_collective_in_a_run_that_failed_names_the_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without probing anyone: at thousands of trainers, those whose collective fails after
    the first named the loss do not each probe them all."""
    monkeypatch.setattr(failure._TASK, "attached", None)
    cluster = {"chief": ("127.0.0.1:1",), "worker": ("127.0.0.1:2",)}
    failure.attach(
        tmp_path, ClusterRole(cluster=cluster, role="worker", index=0, run_id="7.0.0"), "node2"
    )
    assert failure.record_lost("chief 0", "node1:1", watchdog.REFUSED.recorded) is None

    def end_now(status: int, reason: str) -> None:
        raise EndedError(status)

    probed: list[str] = []
    monkeypatch.setattr(exits, "end_now", end_now)

    def refuses(address: str) -> bool:
        probed.append(address)
        return True

    monkeypatch.setattr(watchdog, "_refuses", refuses)
    watch = PeerWatch({}, others={"chief 0": "127.0.0.1:1"})
    try:
        with pytest.raises(EndedError) as ended:
            watch.end_for_a_lost_peer("all-reduce failed")
    finally:
        watch.stop()
    assert ended.value.args == (ExitStatus.PEER_LOST,) and probed == []
    # Nor does a watch stopped once its peers finished: one of them leaving is no loss.
    (tmp_path / "failures").rename(tmp_path / "gone")
    assert failure.first() is None
    finished = PeerWatch({}, others={"chief 0": "127.0.0.1:1"}, **FAST)
    finished.stop()
    with pytest.raises(EndedError):
        finished.end_for_a_lost_peer("all-reduce failed")
    assert probed == []


def test_a_keras3_chief_s_port_is_answered_once_its_jax_service_has_closed_it() -> None:
    """with-tfconfig --keras3's chief: JAX's coordination service listens on its port, and
    shuts down at the command's exit seconds before its process ends; the supervisor answers
    there (WAITING) from the moment the port is free, not before the service listened, and
    a block of answering within it takes the port over."""
    port = free_port_block(1)
    role = ClusterRole(cluster={"chief": (f"localhost:{port}",)}, role="chief", index=0)
    address = f"127.0.0.1:{port}"
    with watchdog.once_free(role):
        assert not watchdog.answers(address)
        with socket.create_server(("0.0.0.0", port)) as service:
            service.settimeout(5)
            # The supervisor's look, which finds the service listening.
            service.accept()[0].close()
        # Said WAITING: alive, not finished.
        assert wait_until(lambda: watchdog.says_finished(address) is False, 5)
        with watchdog.answering(role) as answer:
            answer.append(watchdog.FINISHED)
            assert watchdog.says_finished(address)
    assert watchdog._SERVING == []

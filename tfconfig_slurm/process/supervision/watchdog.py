"""Ends a task whose cluster has lost a member, where SLURM cannot see the loss: TensorFlow
waits forever on a dead peer. Every task listens on its port while it has work, and the kernel
completes a TCP handshake even while the process is busy, so a port that refuses (or, a node
cut off, never answers) for a few seconds in a row means the task is gone. A task without a
server of its own there (a with-tfconfig supervisor, a Keras 3 process: JAX listens only on the
chief's) answers on its port itself (`answering`); before its command starts a server, a task
checks its port and its peers' addresses (`check_task`)."""

from __future__ import annotations

import contextlib
import functools
import re
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Callable, NamedTuple, NoReturn

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF, EVALUATOR, PS, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process import exits, timing
from tfconfig_slurm.process.records import failure

# What a supervised task answers on its port once its command has finished (a gRPC server
# answers with its own first frame); before that, while the trainers below it work; and once
# its command failed. All the same length: a probe reads that much.
FINISHED = b"tfconfig-slurm: finished\n"
WAITING = b"tfconfig-slurm: waiting.\n"
FAILED = b"tfconfig-slurm: failed..\n"

OnLost = Callable[[str, str, float], None]


class Loss(NamedTuple):
    """How a peer was found lost: as this task's log line and the run's failure record say."""

    said: str
    recorded: str


def silence(silent_for: float) -> Loss:
    """A peer silent for `silent_for` seconds, or (0) that said its command failed."""
    if silent_for == 0:
        return Loss("says its command failed", "its command failed")
    return Loss(
        f"has not answered for {silent_for:.0f} s: it died or its node is cut off",
        f"{failure.STOPPED_ANSWERING}: killed, or its node cut off",
    )


# A peer whose port refuses once a collective with it failed (a live one listened before).
REFUSED = Loss(
    "refuses connections since a collective with it failed: its process is gone",
    f"{failure.STOPPED_ANSWERING}: its port refuses connections, its process gone",
)


def exit_on_lost(name: str, address: str, silent_for: float) -> None:
    """Reports the lost peer (report_lost) and ends this process at once (exits.py says why)."""
    report_lost(name, address, silence(silent_for))
    exits.end_now(ExitStatus.PEER_LOST, f"{name} is lost")


def report_lost(name: str, address: str, loss: Loss) -> failure.Failure | None:
    """Records the lost peer as the run's failure and says this task ends for it; where the run
    had failed already, names and returns that first failure (the peer may have ended for it)."""
    first = failure.record_lost(name, address, loss.recorded)
    if first is None:
        logging.error(
            "%s at %s %s; ending this task (exit %d) so that the job ends instead of waiting for "
            "it forever",
            name,
            address,
            loss.said,
            ExitStatus.PEER_LOST,
        )
        logging.flush()
        sys.stderr.flush()
    else:
        failure.say_ending(first.line(), ExitStatus.PEER_LOST, why=f", as {name} is gone")
    return first


class PeerWatch:
    """Watches peers (`{"ps 0": "node1:10256"}`) from a thread until each is released or says
    FINISHED (`on_finished` told). `others`: the peers of this task's collectives."""

    def __init__(
        self,
        peers: Mapping[str, str],
        on_lost: OnLost = exit_on_lost,
        *,
        lost_after: float = timing.LOST_AFTER_SECONDS,
        start_seconds: float = timing.START_SECONDS,
        probe_seconds: float = timing.PROBE_SECONDS,
        on_finished: Callable[[str], None] | None = None,
        others: Mapping[str, str] | None = None,
    ) -> None:
        self._addresses = dict(peers)
        self._others = dict(others or {})
        self._on_lost, self._on_finished = on_lost, on_finished
        self._lost_after, self._start_seconds = lost_after, start_seconds
        self._interval = round_seconds(len(peers), probe_seconds)
        self._lock = threading.Lock()
        self._watched = set(peers)
        self._last_answer: dict[str, float | None] = dict.fromkeys(self._addresses)
        self._stopped = threading.Event()
        self._since = time.monotonic()
        threading.Thread(target=self._watch, name="peer-watch", daemon=True).start()
        _LIVE.add(self)

    def release(self, *names: str) -> None:
        """Stops watching these peers."""
        with self._lock:
            self._watched.difference_update(names)

    def end_for_a_lost_peer(self, what_failed: str, error: str = "") -> NoReturn:
        """For a task whose collective failed (`error` may name the peer): names the first of
        `others` whose port refuses, else waits for the watch to, then ends the process. At
        once, not after the watch's grace: gloo may abort JAX's coordinator, and JAX the rest."""
        logging.warning("%s; finding which peer is gone", what_failed)
        # A watch stopped, its peers finished: one of them leaving is no loss.
        if not self._stopped.is_set():
            self._name_a_refusing_peer(error or what_failed)
        # Every peer had started: the collective ran with all of them before.
        self.snap(started=True)
        # As long as the watch may take to name a peer that has just gone.
        time.sleep(2 * self._interval + self._lost_after + timing.CONNECT_TIMEOUT_SECONDS)
        logging.error(
            "a peer is gone, not one this task watches (%s); ending this task (exit %d)",
            ", ".join(sorted(self._addresses)),
            ExitStatus.PEER_LOST,
        )
        exits.end_now(ExitStatus.PEER_LOST, "a peer is gone")

    def _name_a_refusing_peer(self, error: str) -> None:
        """Ends this process naming the first of `others` whose port refuses (those on a host
        `error` names first), or the run's failure once recorded; else returns."""
        named = _named_hosts(self._others.values(), error)
        suspects = sorted(self._others, key=lambda name: _host(self._others[name]) not in named)
        for probed, name in enumerate(suspects):
            if probed % _RECORD_LOOK_EVERY == 0 and (first := failure.first()) is not None:
                failure.say_ending(first.line(), ExitStatus.PEER_LOST, why=", as a peer is gone")
                exits.end_now(ExitStatus.PEER_LOST, "the run failed")
            address = self._others[name]
            if _refuses(address):
                self.stop()
                report_lost(name, address, REFUSED)
                exits.end_now(ExitStatus.PEER_LOST, f"{name} is lost")
            if _host(address) not in named:
                time.sleep(1 / timing.PROBES_PER_SECOND)

    def stop(self) -> None:
        """Stops watching every peer at once: nothing more is reported."""
        self._stopped.set()

    def snap(self, *, started: bool = False) -> None:
        """Loses at once each watched peer that answered before (or has `started`) whose port
        refuses twice: for a task told to stop, as SLURM stops a step whose task failed."""
        with self._lock:
            if self._stopped.is_set():
                return
            answered = [
                name for name in self._watched if started or self._last_answer[name] is not None
            ]
        refused = [name for name in answered if _refuses(self._addresses[name])]
        if refused:
            time.sleep(timing.SNAP_RECHECK_SECONDS)
        for name in refused:
            if _refuses(self._addresses[name]):
                self._lose(name, time.monotonic() - (self._last_answer[name] or self._since))

    def _watch(self) -> None:
        failing_since: dict[str, float] = {}
        while not self._stopped.wait(self._interval):
            with self._lock:
                watched = sorted(self._watched)
            # Read at most once a round: a ps may wait on hundreds of trainers still starting.
            run_failed = functools.cache(failure.run_failed)
            for name in watched:
                if self._stopped.is_set():
                    return
                now = time.monotonic()
                answer = _probe(self._addresses[name], read=True)
                if answer == FAILED:
                    self._lose(name, 0.0)
                    continue
                if answer == FINISHED and self._on_finished is not None:
                    self.release(name)
                    if not self._stopped.is_set():
                        self._on_finished(name)
                    continue
                if answer is not None:
                    self._last_answer[name] = now
                    failing_since.pop(name, None)
                    continue
                since = failing_since.setdefault(name, now)
                answered = self._last_answer[name]
                # A peer yet to answer is given its start, unless the run failed meanwhile.
                if answered is None and (now - self._since >= self._start_seconds or run_failed()):
                    self._lose(name, now - self._since)
                elif answered is not None and (now - since >= self._lost_after or run_failed()):
                    self._lose(name, now - answered)

    def _lose(self, name: str, silent_for: float) -> None:
        with self._lock:
            if name not in self._watched or self._stopped.is_set():
                return
            self._watched.discard(name)
        self._on_lost(name, self._addresses[name], silent_for)


# Every how many probes of a failed collective's peers the run's failure record is read.
_RECORD_LOOK_EVERY = 16
_IPV4 = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?![0-9])")

_LIVE: weakref.WeakSet[PeerWatch] = weakref.WeakSet()


def snap_all() -> None:
    """PeerWatch.snap for every watch of this process that is still watching."""
    for watch in list(_LIVE):
        watch.snap()


def _named_hosts(addresses: Iterable[str], text: str) -> set[str]:
    """The hosts of `addresses` at an IP address `text` names (gloo's "Connection closed by
    peer [10.251.0.12]:21391"): one lookup per address named, not per host (hundreds)."""
    ips = set(_IPV4.findall(text))
    hosts = {_host(address) for address in addresses}
    named = hosts & ips
    # A lookup may wait seconds on a resolver that knows no address's name.
    for ip in ips if not named else ():
        try:
            name, aliases, _ = socket.gethostbyaddr(ip)
        except OSError:
            continue
        names = {name, *aliases}
        # node2 for node2.cluster.example, or the other way round.
        names |= {each.split(".")[0] for each in names}
        named |= {host for host in hosts if host in names or host.split(".")[0] in names}
    return named


def _host(address: str) -> str:
    return address.rpartition(":")[0]


def _refuses(address: str) -> bool:
    """Whether `address`'s host refuses a connection: it is up, and nothing listens there."""
    try:
        _connect(address).close()
    except OSError as error:
        return isinstance(error, ConnectionRefusedError)
    return False


def _connect(address: str) -> socket.socket:
    """A connection to `address` (`node1:10256`), or OSError within
    timing.CONNECT_TIMEOUT_SECONDS."""
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timing.CONNECT_TIMEOUT_SECONDS)


def until_gone(
    peers: Mapping[str, str], *, unseen_for: float = 0.0, within: float = timing.GONE_SECONDS
) -> None:
    """Returns once none of `peers` answers (one never seen: after `unseen_for`), or `within`."""
    started = time.monotonic()
    unseen = set(peers.values())
    while (now := time.monotonic()) < started + within:
        answering = set(filter(answers, peers.values()))
        unseen -= answering
        if not answering and (not unseen or now >= started + unseen_for):
            return
        left = started + unseen_for - now
        time.sleep(min(timing.PROBE_SECONDS, left) if left > 0 else timing.PROBE_SECONDS)


def round_seconds(peers: int, probe_seconds: float = timing.PROBE_SECONDS) -> float:
    """How often a watcher of `peers` peers probes each of them."""
    return max(probe_seconds, peers / timing.PROBES_PER_SECOND)


def answers(address: str) -> bool:
    """Whether anything listens at `address`."""
    return _probe(address, read=False) is not None


def says_finished(address: str) -> bool | None:
    """Whether the task at `address` answers FINISHED; None if nothing listens there."""
    answer = _probe(address, read=True)
    return None if answer is None else answer == FINISHED


def _probe(address: str, *, read: bool) -> bytes | None:
    """None if nothing listens at `address`; else, with `read`, the first bytes it sends (b""
    for none soon: a listener is alive whatever it says)."""
    try:
        connection = _connect(address)
    except OSError:
        return None
    with connection:
        if not read:
            return b""
        connection.settimeout(timing.READ_TIMEOUT_SECONDS)
        try:
            return connection.recv(len(FINISHED))
        except OSError:
            return b""


# The answers of the port this process serves: a block within another changes what the port
# answers (WAITING to FAILED, say), as it cannot bind the port a second time.
_SERVING: list[list[bytes]] = []
# Held while _SERVING is looked at and the port bound: once_free's thread binds it too.
_BINDING = threading.Lock()


@contextlib.contextmanager
def answering(role: ClusterRole) -> Iterator[list[bytes]]:
    """Within the block, this task's port answers the last of the list it yields (WAITING)."""
    with _BINDING:
        serving = _SERVING[-1] if _SERVING else None
        listener, problem = None, ""
        if serving is None:
            try:
                listener = _bound(role)
            except OSError as error:
                problem = error.strerror or str(error)
    if serving is not None:
        yield serving
        return
    answer = [WAITING]
    if listener is None:
        logging.warning(
            "%s %d cannot answer on its port %d (%s): its watchers will take it for lost",
            role.role,
            role.index,
            _port(role),
            problem,
        )
    with contextlib.nullcontext() if listener is None else _served(listener, answer):
        yield answer


@contextlib.contextmanager
def once_free(role: ClusterRole) -> Iterator[None]:
    """Within the block, this task's port answers WAITING once the command's own server there
    has closed it: a --keras3 chief's JAX service shuts down seconds before its process ends."""
    stopped = threading.Event()
    held = contextlib.ExitStack()

    def take_over() -> None:
        while not answers(f"127.0.0.1:{_port(role)}"):
            if stopped.wait(timing.PROBE_SECONDS / 4):
                return
        while not stopped.wait(_TAKE_OVER_SECONDS):
            with _BINDING:
                if _SERVING:
                    return
                with contextlib.suppress(OSError):
                    held.enter_context(_served(_bound(role), [WAITING]))
                    return

    thread = threading.Thread(target=take_over, name="port once free", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopped.set()
        thread.join()
        held.close()


# How often once_free tries to bind a port its command's server holds.
_TAKE_OVER_SECONDS = 0.05


def _port(role: ClusterRole) -> int:
    return int(role.address.rpartition(":")[2])


def _bound(role: ClusterRole) -> socket.socket:
    return socket.create_server(("0.0.0.0", _port(role)), reuse_port=False)


@contextlib.contextmanager
def _served(listener: socket.socket, answer: list[bytes]) -> Iterator[None]:
    """`listener` answers the last of `answer` until the block ends."""
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), connection:
                connection.sendall(answer[-1])

    threading.Thread(target=serve, daemon=True).start()
    _SERVING.append(answer)
    try:
        yield
    finally:
        _SERVING.remove(answer)
        stopped.set()
        listener.close()


# TensorFlow says neither a peer's address that does not resolve (it looks like a peer that
# never answers, given timing.START_SECONDS to start) nor a busy port (gRPC binds without
# SO_REUSEPORT, and its server dies with `UnknownError: Could not start gRPC server`) well.


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
        host = _host(address)
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

"""What with-tfconfig's supervision costs as a job grows: one watcher (a parameter server's
wrapper, or the runtime's watchdog) and N peers listening on loopback, in one process.

For each N it measures, with the watcher's real settings (process/supervision/watchdog.py):
- round: seconds from the watcher's start until every peer has answered once;
- finished: seconds from every peer answering FINISHED (as a trainer's wrapper does once its
  command exited 0) until the watcher has seen them all: a parameter server's wait from the
  last trainer's end to its own;
- lost: seconds from one peer's port closing until the watcher names it;
- probes/s made by the watcher, and its CPU seconds per round.

Then the tree of trainers that with-tfconfig's finished trainers form (cluster/watch_plan.py),
with the real supervise.say_finished of every trainer, each in a thread of this process, and
fake parameter servers listening: every trainer but the deepest one finishes, and then that
one; "tree" is the seconds from its finish until ps 0's watcher sees the chief say FINISHED
(every trainer finished), which is when ps 0's wrapper ends its command.

  .venv/bin/python bench/supervision.py [--peers 100,1000] [--trees 100,1000]
"""

from __future__ import annotations

import argparse
import contextlib
import selectors
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfconfig_slurm.cluster import watch_plan
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.process.supervision import supervise, watchdog

# A gRPC server's first bytes (an HTTP/2 SETTINGS frame header): what a training peer answers.
_TRAINING = b"\x00\x00\x18\x04\x00\x00\x00\x00\x00"


class Peers:
    """N listening sockets, answered from one thread: as training peers, then as finished."""

    def __init__(self, count: int) -> None:
        self.answer = _TRAINING
        self.connections = 0
        self._selector = selectors.DefaultSelector()
        self.sockets: dict[str, socket.socket] = {}
        for index in range(count):
            listener = socket.create_server(("127.0.0.1", 0), backlog=64)
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ)
            self.sockets[f"worker {index}"] = listener
        self._stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def addresses(self) -> dict[str, str]:
        return {name: f"127.0.0.1:{sock.getsockname()[1]}" for name, sock in self.sockets.items()}

    def close(self, name: str) -> None:
        listener = self.sockets.pop(name)
        self._selector.unregister(listener)
        listener.close()

    def stop(self) -> None:
        self._stopped.set()
        for listener in self.sockets.values():
            listener.close()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                with contextlib.suppress(OSError):
                    connection, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    with connection:
                        connection.sendall(self.answer)
                    self.connections += 1


def measure(count: int) -> str:
    peers = Peers(count)
    addresses = peers.addresses()
    finished: list[str] = []
    lost: list[tuple[str, float]] = []
    all_finished, one_lost = threading.Event(), threading.Event()

    def on_finished(name: str) -> None:
        finished.append(name)
        if len(finished) == len(peers.sockets):
            all_finished.set()

    def on_lost(name: str, address: str, silent_for: float) -> None:
        lost.append((name, time.monotonic()))
        one_lost.set()

    started, cpu = time.monotonic(), time.process_time()
    watch = watchdog.PeerWatch(addresses, on_lost=on_lost)
    # Every peer answered once: the watcher's first round is over.
    while peers.connections < count:
        time.sleep(0.05)
    round_seconds = time.monotonic() - started
    cpu_per_round = time.process_time() - cpu
    probes_per_second = peers.connections / round_seconds
    victim = "worker 0"
    closed = time.monotonic()
    peers.close(victim)
    one_lost.wait(4 * round_seconds + 10)
    lost_seconds = lost[0][1] - closed if lost else float("nan")
    watch.stop()

    # A parameter server's end: every trainer finished at once.
    watch = watchdog.PeerWatch(peers.addresses(), on_lost=on_lost, on_finished=on_finished)
    time.sleep(1.0)
    peers.answer = watchdog.FINISHED
    told = time.monotonic()
    all_finished.wait(4 * round_seconds + 10)
    finished_seconds = time.monotonic() - told if all_finished.is_set() else float("nan")
    watch.stop()
    peers.stop()
    return (
        f"| {count} | {round_seconds:.1f} | {probes_per_second:.0f} | {cpu_per_round:.2f} "
        f"| {lost_seconds:.1f} | {finished_seconds:.1f} |"
    )


def measure_tree(trainers: int) -> str:
    """The last trainer's finish until ps 0's watcher sees the chief say FINISHED."""
    servers = Peers(max(1, trainers // 8))
    ports = _free_ports(trainers)
    jobs = {
        "chief": (f"127.0.0.1:{ports[0]}",),
        "worker": tuple(f"127.0.0.1:{port}" for port in ports[1:]),
        "ps": tuple(servers.addresses().values()),
    }
    roles = [ClusterRole(jobs, "chief", 0)]
    roles += [ClusterRole(jobs, "worker", index) for index in range(trainers - 1)]
    lost: list[str] = []

    def on_lost(name: str, address: str, silent_for: float) -> None:
        lost.append(name)

    def finish(role: ClusterRole) -> None:
        supervise.say_finished(role, on_lost)

    last = roles[-1]
    for role in roles[:-1]:
        threading.Thread(target=finish, args=(role,), daemon=True).start()
    # Every other trainer finished and waits on its children: let them settle.
    time.sleep(3.0)
    everyone = threading.Event()
    chief = watchdog.PeerWatch(
        {"chief 0": jobs["chief"][0]}, on_lost=on_lost, on_finished=lambda name: everyone.set()
    )
    time.sleep(1.5)
    finished = time.monotonic()
    threading.Thread(target=finish, args=(last,), daemon=True).start()
    everyone.wait(120.0)
    seconds = time.monotonic() - finished if everyone.is_set() else float("nan")
    chief.stop()
    servers.stop()
    depth, below = 0, trainers - 1
    while below > 0:
        depth, below = depth + 1, below - watch_plan.FAN_OUT ** (depth + 1)
    return f"| {trainers} | {depth} | {seconds:.1f} | {len(lost)} |"


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.create_server(("0.0.0.0", 0))) for _ in range(count)]
        return [sock.getsockname()[1] for sock in sockets]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default="100,1000")
    parser.add_argument("--trees", default="100,1000")
    args = parser.parse_args()
    print("| peers | round (s) | probes/s | CPU s per round | lost: named after (s) "
          "| finished: all seen after (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for count in filter(None, args.peers.split(",")):
        print(measure(int(count)), flush=True)
    print("\n| trainers | tree depth | tree: last finish to the chief's FINISHED (s) | lost |")
    print("|---|---|---|---|")
    for count in filter(None, args.trees.split(",")):
        print(measure_tree(int(count)), flush=True)


if __name__ == "__main__":
    main()

"""A trainer that lives but makes no step is hung: found, named with its stack, and ended.

A backend says when training begins (`began`), each step (`stepped`: a clock read) and when it
pauses (`paused`); a thread finds the task hung after no step for its bound (Watch.bound). In a
collective every peer of a stuck trainer stops too, so a hung task gathers its peers' accounts
and names the one waiting in its own code (its data, its I/O) rather than in TensorFlow, JAX or
the runtime, else the one whose last step is oldest. That is recorded as the run's failure
(worth a restart once a step), and the process ends. Parameter servers and evaluators take no
steps and are never watched; an asynchronous Estimator worker is watched alone, as its peers go
on. No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Callable, NamedTuple

from absl import logging

from tfconfig_slurm.cluster.layout import CHIEF, WORKER
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import ExitStatus, UsageError
from tfconfig_slurm.process import exits, timing
from tfconfig_slurm.process.records import failure, files
from tfconfig_slurm.process.records.run_dir import RunDir
from tfconfig_slurm.process.supervision import watchdog

# --hang_timeout's variable, and its default: far above a step of any shipped experiment, a
# checkpoint's write included.
VARIABLE = "TFCONFIG_SLURM_HANG_TIMEOUT"
DEFAULT_SECONDS = 300.0
# The bound is at least this many of the slowest step seen: a minute a step is no hang.
SLOWEST_STEPS = 10
# The first step's bound is this many times the bound: it builds, compiles and restores.
FIRST_STEP_BOUNDS = 3
# The package's own code: a trainer whose training thread waits in it waits on its peers (a
# gather, a barrier); its shipped experiments are a user's code like any other.
_PACKAGE = Path(__file__).resolve().parents[2]
_EXPERIMENTS = _PACKAGE / "experiments"
# Installed libraries and the standard library: TensorFlow, JAX and Keras wait there.
_LIBRARIES = tuple(
    {str(Path(sysconfig.get_paths()[name]).resolve()) for name in ("stdlib", "purelib", "platlib")}
)


def seconds_from(flag: float | None, environ: Mapping[str, str]) -> float:
    """The hang bound: `flag` (--hang_timeout), else the variable, else DEFAULT_SECONDS; 0: off."""
    if flag is not None:
        return flag
    given = environ.get(VARIABLE, "")
    if not given:
        return DEFAULT_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UsageError(
            VARIABLE,
            f"is {given!r}, and should be the seconds without a step after which a trainer is "
            "hung (0: never)",
            f"export {VARIABLE}={DEFAULT_SECONDS:.0f}, or unset it for the default",
        )
    return seconds


class Account(NamedTuple):
    """A hung task's account of itself, which its hung peers read to name the one to blame."""

    task: str
    node: str
    # The global step after its last step, and when that step ended (time.time()).
    step: int
    stepped_at: float
    # Where its training thread (or a thread of its data) waits: "file.py:33 in batches".
    waits_in: str
    # Whether that is its own code, not TensorFlow's, JAX's or the runtime's.
    own_code: bool


class Watch:
    """This task's steps, and the thread that finds it hung."""

    def __init__(self, seconds: float, role: ClusterRole | None, model_dir: Path, node: str):
        self._seconds = seconds
        self._role, self._model_dir, self._node = role, model_dir, node
        self._step, self._stepped_at, self._slowest, self._armed = 0, 0.0, 0.0, False
        # Whether the next step is the training's first.
        self._first = True
        self._thread: threading.Thread | None = None
        # What says the run failed, where this task owns it (`when_hung`).
        self.says_failed: Callable[[str], None] | None = None

    def beat(self, global_step: int, *, first: bool = False) -> None:
        now = time.monotonic()
        if self._armed and not self._first:
            self._slowest = max(self._slowest, now - self._stepped_at)
        self._step, self._stepped_at, self._armed, self._first = global_step, now, True, first
        if self._thread is None and self._seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="hang-watch", daemon=True)
            self._thread.start()

    def silent_since(self, moment: float) -> float | None:
        """Seconds without a step since `moment` (time.monotonic()) or the last step, the later:
        0 while it rests (a checkpoint's write), None where it never began (a parameter server)."""
        if not self._stepped_at:
            return None
        if not self._armed:
            return 0.0
        return time.monotonic() - max(moment, self._stepped_at)

    def pause(self) -> None:
        self._armed = False

    def bound(self) -> float:
        bound = max(self._seconds, SLOWEST_STEPS * self._slowest)
        return bound * FIRST_STEP_BOUNDS if self._first else bound

    def _watch(self) -> None:
        while True:
            bound = self.bound()
            silent = time.monotonic() - self._stepped_at
            if self._armed and silent >= bound:
                self._hung(silent, bound)
            time.sleep(timing.HANG_CHECK_SECONDS)

    def _hung(self, silent: float, bound: float) -> None:
        step = self._step
        name = str(self._role.task_id) if self._role else "the process"
        since = f"{'its training began at ' if self._first else ''}global step {step}"
        logging.error(
            "%s: hung: no step for %.0f s since %s (its bound: %.0f s, --hang_timeout); every "
            "thread's stack follows",
            name,
            silent,
            since,
            bound,
        )
        stacks = write_stacks(name)
        waits_in, own = where_it_waits(stacks)
        mine = Account(name, self._node, step, time.time() - silent, waits_in, own)
        accounts = self._accounts(mine)
        blamed, rule = blame(accounts)
        # The blamed task's own silence, which may be longer than this one's.
        silent = max(silent, time.time() - blamed.stepped_at) if blamed != mine else silent
        what = (
            f"hung at global step {blamed.step}: no step for {silent:.0f} s, waiting in "
            f"{'its own code' if blamed.own_code else 'TensorFlow, JAX or the runtime'} "
            f"({blamed.waits_in}){rule}; every thread's stack is in its task's log"
        )
        first = failure.record_hang(blamed.task, blamed.node, what)
        if self.says_failed is not None:
            self.says_failed(f"{blamed.task} {what}")
        failure.say_ending(
            first.line() if first else f"{blamed.task} on {blamed.node}: {what}",
            ExitStatus.HUNG,
            how="hung",
        )
        if self._role is not None and self._role.role == CHIEF:
            # Its process may hold the run's JAX service, without which JAX aborts the others
            # (SIGABRT, which srun reports as a crash, not worth a restart).
            watchdog.until_gone(self._role.named(WORKER), within=timing.FAILING_SECONDS)
        exits.end_now(ExitStatus.HUNG, f"{blamed.task} hung")

    def _accounts(self, mine: Account) -> list[Account]:
        """This task's account, left for its hung peers, and theirs, read until all are in or
        timing.HANG_ACCOUNTS_SECONDS pass (none outside a cluster)."""
        role = self._role
        if role is None or role.run_id is None:
            return [mine]
        path = RunDir(self._model_dir).hang_account(role.run_id, role.task_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomically(path, json.dumps(mine._asdict()) + "\n")
        except OSError as error:
            logging.warning("%s: its account of the hang cannot be written: %s", mine.task, error)
        deadline = time.monotonic() + timing.HANG_ACCOUNTS_SECONDS
        while True:
            accounts = _read_accounts(path.parent) or [mine]
            if len(accounts) >= role.trainers or time.monotonic() >= deadline:
                return accounts
            time.sleep(timing.FAILURE_POLL_SECONDS)


def blame(accounts: Sequence[Account]) -> tuple[Account, str]:
    """The hung task to blame: the one waiting in its own code, else (or where several do) the
    one whose last step is oldest; and the rule that named it, for its line."""
    own = [account for account in accounts if account.own_code]
    oldest = min(own or accounts, key=lambda account: account.stepped_at)
    if len(own) == 1 or len(accounts) == 1:
        return oldest, ""
    among = "the tasks that wait in their own code" if own else "the hung tasks"
    return oldest, f"; of {among}, its last step is the oldest"


def where_it_waits(stacks: Mapping[int, FrameType]) -> tuple[str, bool]:
    """Where this process waits: the innermost frame of the user's code in any thread (a
    data generator may run on a thread of TensorFlow's), else the training (main) thread's
    innermost frame; and whether it is the user's code."""
    for frame in stacks.values():
        own = next((each for each in _frames(frame) if _users(each.f_code.co_filename)), None)
        if own is not None:
            return _said(own), True
    main = stacks.get(threading.main_thread().ident or 0)
    return (_said(main) if main is not None else "no frame"), False


def _frames(frame: FrameType) -> list[FrameType]:
    """A stack's frames, innermost first, up to the first that is not a library's: a frame
    below a library's call into the user's code (a callback) is not where it waits."""
    inner: list[FrameType] = []
    for each, _ in traceback.walk_stack(frame):
        inner.append(each)
        if not _library(each.f_code.co_filename):
            break
    return inner


def _users(filename: str) -> bool:
    path = os.path.realpath(filename)
    own = not _library(filename) and not path.startswith(str(_PACKAGE))
    return own or path.startswith(str(_EXPERIMENTS))


def _library(filename: str) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(_LIBRARIES)


def _said(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"


def write_stacks(task: str) -> Mapping[int, FrameType]:
    """Writes every thread's Python stack to the task's log (stderr), each headed with `task`
    (several tasks may share one output, a plain srun's); returns them."""
    stacks = sys._current_frames()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = []
    for ident, frame in stacks.items():
        lines.append(f"\n{task}, thread {names.get(ident, ident)!s} (most recent call last):\n")
        lines.extend(traceback.format_stack(frame))
    logging.flush()
    sys.stderr.write("".join(lines) + "\n")
    sys.stderr.flush()
    return stacks


def _read_accounts(folder: Path) -> list[Account]:
    accounts = []
    for path in sorted(folder.glob("*.json")):
        try:
            accounts.append(Account(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # one written as it is read: the next round reads it
    return accounts


class _Current:
    """This process's watch: until the lifecycle makes one (`watch`), one that only counts."""

    watch = Watch(0.0, None, Path(), "")


_CURRENT = _Current()


def watch(seconds: float, role: ClusterRole | None, model_dir: Path, node: str) -> None:
    """This process's steps watched from now on for a hang of `seconds` (0: only counted)."""
    _CURRENT.watch = Watch(seconds, role, model_dir, node)


def when_hung(says_failed: Callable[[str], None]) -> None:
    """Once this task is found hung, `says_failed(what)` records it in the run's state.json."""
    _CURRENT.watch.says_failed = says_failed


def silent_since(moment: float) -> float | None:
    """Watch.silent_since of this process's watch."""
    return _CURRENT.watch.silent_since(moment)


def began(global_step: int) -> None:
    """Training begins at `global_step`: its first step is due."""
    _CURRENT.watch.beat(global_step, first=True)


def stepped(global_step: int) -> None:
    """A step ended at `global_step`, said on the training thread."""
    _CURRENT.watch.beat(global_step)


def paused() -> None:
    """No more steps for now (training ended): no hang until the next."""
    _CURRENT.watch.pause()

"""How many processes of the test suite start TensorFlow, and which: #38's measure of the suite.

    .venv/bin/python bench/tensorflow_starts.py [COMMAND...]     (default: tests/lanes)

Runs COMMAND with an audit hook in the test environments' Pythons (.venv, .venv-tf2): a `.pth`
file there, live only while this script's flag file exists, notes each process that imports
tensorflow. Prints the count of those processes and the commands that started the most, then
removes the hook. Each start costs 4-6 s of CPU on this machine (TensorFlow's import): the
suite's time follows their number. Not part of `make bench`: it runs the whole suite.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
ENVIRONMENTS = (".venv", ".venv-tf2")
HOOK = "zz_tensorflow_starts.pth"
# One line, as a .pth file runs it: while the flag file exists and this script lives, a
# process's first import of tensorflow appends its command line to the log, once; a log that
# cannot be written loses the line, never the import.
HOOK_SOURCE = """
def _tensorflow_start(event, args):
    import os, sys
    if event != "import" or args[0] != "tensorflow" or getattr(sys, "_tensorflow_started", 0):
        return
    if not (os.path.exists({flag!r}) and os.path.exists("/proc/{bench}")):
        return
    sys._tensorflow_started = 1
    try:
        with open({log!r}, "a") as log:
            log.write(" ".join(sys.argv)[:200] + "\\n")
    except OSError:
        pass
sys.addaudithook(_tensorflow_start)
"""
LINE = "import sys; exec({source!r})\n"


def site_packages(environment: str) -> Path:
    found = subprocess.run(
        [str(REPOSITORY / environment / "bin" / "python"), "-c",
         "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(found.stdout.strip())


def main(command: list[str]) -> int:
    missing = [name for name in ENVIRONMENTS if not (REPOSITORY / name / "bin" / "python").exists()]
    if missing:
        sys.stderr.write(f"tensorflow_starts: {missing[0]} is missing. HINT: make venvs\n")
        return 2
    with tempfile.TemporaryDirectory(prefix="tensorflow-starts-") as scratch:
        flag, log = Path(scratch) / "on", Path(scratch) / "starts.log"
        source = HOOK_SOURCE.format(flag=str(flag), log=str(log), bench=os.getpid())
        hooks = [site_packages(environment) / HOOK for environment in ENVIRONMENTS]
        try:
            for hook in hooks:
                hook.write_text(LINE.format(source=source))
            flag.touch()
            status = subprocess.run(command, cwd=REPOSITORY, check=False).returncode
        finally:
            flag.unlink(missing_ok=True)
            for hook in hooks:
                hook.unlink(missing_ok=True)
        starts = log.read_text().splitlines() if log.exists() else []
    # Commands grouped without their temporary paths, which differ from test to test.
    grouped = collections.Counter(
        re.sub(r"/tmp/pytest-of-\w+/pytest-\d+/(popen-gw\d+/)?", "", argv)[:110] for argv in starts
    )
    print(f"{len(starts)} processes imported tensorflow; {' '.join(command)}: exit {status}")
    for argv, count in grouped.most_common(25):
        print(f"{count:4d}  {argv}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tests/lanes"]))

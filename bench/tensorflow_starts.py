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
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
ENVIRONMENTS = (".venv", ".venv-tf2")
HOOK = "zz_tensorflow_starts.pth"
# One line, as a .pth file runs it: where the flag file exists, each import of tensorflow
# appends the process id and its command line to the log beside it.
LINE = (
    "import os, sys; os.path.exists({flag!r}) and sys.addaudithook(lambda event, args, "
    "_os=os: event == 'import' and args[0] == 'tensorflow' and open({log!r}, 'a').write("
    "'%d %s\\n' % (_os.getpid(), ' '.join(sys.argv)[:200])))\n"
)


def site_packages(environment: str) -> Path:
    found = subprocess.run(
        [str(REPOSITORY / environment / "bin" / "python"), "-c",
         "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(found.stdout.strip())


def main(command: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="tensorflow-starts-") as scratch:
        flag, log = Path(scratch) / "on", Path(scratch) / "starts.log"
        hooks = [site_packages(environment) / HOOK for environment in ENVIRONMENTS]
        try:
            for hook in hooks:
                hook.write_text(LINE.format(flag=str(flag), log=str(log)))
            flag.touch()
            status = subprocess.run(command, cwd=REPOSITORY, check=False).returncode
        finally:
            flag.unlink(missing_ok=True)
            for hook in hooks:
                hook.unlink(missing_ok=True)
        starts: dict[str, str] = {}
        for line in log.read_text().splitlines() if log.exists() else []:
            pid, _, argv = line.partition(" ")
            starts.setdefault(pid, argv)
    # Commands grouped without their temporary paths, which differ from test to test.
    grouped = collections.Counter(
        re.sub(r"/tmp/pytest-of-\w+/pytest-\d+/(popen-gw\d+/)?", "", argv)[:110]
        for argv in starts.values()
    )
    print(f"{len(starts)} processes imported tensorflow; {' '.join(command)}: exit {status}")
    for argv, count in grouped.most_common(25):
        print(f"{count:4d}  {argv}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tests/lanes"]))

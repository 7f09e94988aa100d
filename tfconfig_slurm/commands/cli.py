"""How every command of the package starts and fails: absl flags in, one line and exit 2 out.

absl flags and logging, without `absl.app`: it imports pdb at start-up, which every task of a
large step would pay for.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Callable, NoReturn, Optional

from absl import flags

from tfconfig_slurm.errors import TfconfigSlurmError, UsageError
from tfconfig_slurm.process.console import fail, start_logging

Main = Callable[[Sequence[str]], Optional[int]]

HELP = flags.DEFINE_boolean(
    "help", False, "Show this help and the command's flags.", short_name="h"
)
HELPFULL = flags.DEFINE_boolean("helpfull", False, "Show help on every flag, absl's included.")
# absl.app's name for --help, which absl users type.
HELPSHORT = flags.DEFINE_boolean("helpshort", False, "Show this help and the command's flags.")

# Under --help, after the command's own flags: absl's, which its module help leaves out.
_ABSL_FLAGS = """absl's flags, for every command:
  --flagfile: a text file of flags, one a line (--name=value, without shell quotes), read
    as if given here; repeat it for more files.
  --helpfull: every flag, absl's logging flags included.
"""


def run_cli(
    program: str,
    main: Main,
    *,
    stop_at_first_argument: bool = False,
    arguments: bool = False,
    logs: bool = False,
    tensorflow_log_level: str | None = None,
    command: str | None = None,
    usage: str | None = None,
    read_by_scripts: Sequence[flags.FlagHolder[bool]] = (),
) -> NoReturn:
    """Parses the flags of `sys.argv` and runs `main` with what remains, failing as `fail` does.

    `stop_at_first_argument`: flags end at the first word that is not one, so a wrapped
    command's flags reach it untouched; `arguments`: other words may come anywhere; else a
    word that is not a flag is refused. `tensorflow_log_level` sets TF_CPP_MIN_LOG_LEVEL
    unless the environment does. `command` and `usage` are for the hints. Help asked with
    one of `read_by_scripts` is refused: a script would read its text as the answer."""
    command = command or program
    if tensorflow_log_level is not None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", tensorflow_log_level)
    flags.FLAGS.set_gnu_getopt(not stop_at_first_argument)
    own = _own_words(sys.argv, stop_at_first_argument)
    try:
        argv = flags.FLAGS(sys.argv)
    except FLAG_ERRORS as error:
        fail(program, flag_error(error, command, own, usage).one_line())
    quoted = _quoted_in_flagfile(own)
    if quoted is not None:
        fail(program, quoted.one_line())
    # Words left that do not end the command line came from a flag file (absl puts its words
    # where --flagfile stood): a line there that is no flag would lead the wrapped command.
    if stop_at_first_argument and len(argv) > 1 and sys.argv[-len(argv) + 1 :] != argv[1:]:
        stray = UsageError(
            f"{argv[1]!r}{_flagfiles(own)}",
            "is not a flag",
            "a flag file holds flags only, one a line (--name=value); the command comes after "
            "the flags",
        )
        fail(program, stray.one_line())
    if len(argv) > 1 and not (stop_at_first_argument or arguments):
        where = "" if argv[1] in own[1:] else _flagfiles(own)
        stray = UsageError(
            f"{argv[1]!r}{where}", "is not a flag", f"flags start with --; see {command} --help"
        )
        fail(program, stray.one_line())
    if help_asked():
        _help(program, main, command, read_by_scripts)
    if logs:
        start_logging()
    try:
        sys.exit(main(argv))
    except TfconfigSlurmError as error:
        fail(program, error.one_line())


def _help(
    program: str, main: Main, command: str, read_by_scripts: Sequence[flags.FlagHolder[bool]]
) -> NoReturn:
    """Prints the command's help, unless asked with a flag whose answer a script reads."""
    read = next((flag.name for flag in read_by_scripts if flag.value), None)
    if read is not None:
        refused = UsageError(
            "--help",
            f"comes with --{read}, whose answer a batch script reads: the help's text would be "
            "read as the answer (a run directory named by it, jobs submitted)",
            f"ask for it alone where you type commands: {command} --help",
        )
        fail(program, refused.one_line())
    # absl files a module's flags under its name, or the script's path when run with -m.
    owner = sys.argv[0] if main.__module__ == "__main__" else main.__module__
    if HELPFULL.value:
        flag_help, absl_help = flags.FLAGS.get_help(), ""
    else:
        flag_help = flags.FLAGS.module_help(owner).removeprefix(f"\n{owner}:\n")
        absl_help = f"\n{_ABSL_FLAGS}"
    doc = sys.modules[main.__module__].__doc__ or ""
    sys.stdout.write(f"{doc.strip()}\n\nflags:\n{flag_help}\n{absl_help}")
    sys.exit(0)


def help_asked() -> bool:
    """Whether --help, --helpshort or --helpfull was given."""
    return bool(HELP.value or HELPSHORT.value or HELPFULL.value)


# What absl raises for a command line it refuses: ValueError for --noFLAG=1, and
# UnicodeDecodeError for a --flagfile that is no text.
FLAG_ERRORS = (flags.Error, UnicodeDecodeError, ValueError)

# absl's words for a value of the wrong type, as a user would put it.
_EXPECTED = {
    "invalid literal for int()": "a whole number",
    "could not convert": "a number",
    "('Non-boolean": "true or false",
}


def refuse_empty(*holders: flags.FlagHolder[str | None]) -> None:
    """Refuses an empty value, else taken for the flag left out: `--data_dir=$DATA` with
    $DATA unset would train on the default quietly."""
    for holder in holders:
        flags.register_validator(  # type: ignore[no-untyped-call]
            holder.name,
            lambda value: value != "",
            message="empty, as from a variable that is unset",
        )


def flag_error(
    error: Exception, command: str, argv: Sequence[str] = (), usage: str | None = None
) -> UsageError:
    """absl's refusal of a command line, as our error naming the flag (and the --flagfile it
    came from, where `argv` does not give it itself)."""
    if isinstance(error, UnicodeDecodeError):
        return UsageError(
            "--flagfile",
            f"names a file that is not UTF-8 text ({error.reason})",
            "give a text file of flags, one a line (--name=value)",
        )
    text = str(error).strip()
    if isinstance(error, flags.CantOpenFlagFileError):
        reason = re.sub(r"^.*?Unable to open flagfile: (\[Errno \d+\] )?", "", text)
        return UsageError(
            "--flagfile",
            f"cannot be read: {reason}",
            "give the path of a text file of flags, one a line (--name=value)",
        )
    value = re.match(r"flag --(\w+)=(.*?): (.*)$", text, re.S)
    if isinstance(error, flags.IllegalFlagValueError) and value:
        name, given, reason = value.groups()
        quoted = _quoted(name, given, argv)
        if quoted is not None:
            return quoted
        expected = next((said for cue, said in _EXPECTED.items() if reason.startswith(cue)), None)
        bound = re.match(r"\S+ is not (an? .*)$", reason)  # "0 is not a positive integer"
        expected = expected or (bound.group(1) if bound else None)
        said = f"is {given!r}, expected {expected}" if expected else f"is {given!r}: {reason}"
        return UsageError(
            f"--{name}{_in_flagfile(name, argv, given)}",
            said,
            f"{command} --help says what --{name} takes",
        )
    return _said_in_words(text, command, argv, usage) or UsageError(
        "the command line", text.rstrip("."), f"{command} --help lists the flags"
    )


def _said_in_words(
    text: str, command: str, argv: Sequence[str], usage: str | None
) -> UsageError | None:
    """absl's refusals that name a flag in words (unknown, no value, --noFLAG=1) as ours."""
    unknown = re.match(r"Unknown command line flag '([^']+)'(?:\. Did you mean: (.+?) \?)?", text)
    if unknown:
        # absl's "Did you mean: a, b ?" names flags without their dashes.
        close = [f"--{name.strip()}" for name in (unknown.group(2) or "").split(",") if name]
        guess = f"; did you mean {' or '.join(close)}?" if close else ""
        # A flag a user brings from Estimator scripts, where ours does its work (absl's
        # closest name, --log_dir, is its logging's).
        if unknown.group(1) == "model_dir" and "output_root" in flags.FLAGS:
            guess = (
                "; runs go where --output_root says, each in its model directory "
                "<output_root>/<experiment_id>"
            )
        return UsageError(
            f"{_as_typed(unknown.group(1), argv)}{_in_flagfile(unknown.group(1), argv)}",
            f"is not a flag of {command}{guess}",
            f"{usage}; {command} --help lists the flags"
            if usage
            else f"{command} --help lists the flags",
        )
    negated = re.match(r"-+no(\w+)=(.*) does not take an argument$", text, re.S)
    if negated:
        name, given = negated.groups()
        return UsageError(
            f"--no{name}{_in_flagfile('no' + name, argv, given)}",
            f"is given a value ({given!r}), but it only turns --{name} off",
            f"write --no{name} alone, or --{name}=true or --{name}=false",
        )
    missing = re.match(r"Missing value for flag -+(\w+)$", text)
    if missing is None:
        return None
    name = missing.group(1)
    return UsageError(
        f"{_as_typed(name, argv)}{_in_flagfile(name, argv)}",
        "is given no value",
        f"e.g. --{name}=VALUE; {command} --help says what --{name} takes",
    )


def _as_typed(name: str, argv: Sequence[str]) -> str:
    """A flag absl names without dashes, as the user typed it: `-m` or `--m`."""
    one_dash = re.compile(rf"-{re.escape(name)}(=|$)")
    return f"-{name}" if any(one_dash.match(word) for word in argv[1:]) else f"--{name}"


def _own_words(argv: Sequence[str], stop_at_first_argument: bool) -> Sequence[str]:
    """The command's own words: up to `--`, or up to a wrapped command's first word."""
    if "--" in argv:
        argv = argv[: argv.index("--")]
    if not stop_at_first_argument:
        return argv
    at = 1
    while at < len(argv) and argv[at].startswith("-"):
        # A bare --flagfile takes the next word as its file.
        at += 2 if re.fullmatch(r"--?flagfile", argv[at]) else 1
    return argv[:at]


def _in_flagfile(name: str, argv: Sequence[str], value: str | None = None) -> str:
    """` (in --flagfile=F)` for a flag (with this value) the command line does not give."""
    said = rf"=?{re.escape(value)}$" if value is not None else r"(=|$)"
    given = re.compile(rf"--?(no)?{re.escape(name)}{said}")
    # absl takes "--name value" as well as "--name=value".
    here = any(
        given.match(word) or given.match(f"{word}{next_word}")
        for word, next_word in zip(argv[1:], [*argv[2:], ""])
    )
    return "" if here else _flagfiles(argv)


def _quoted_in_flagfile(argv: Sequence[str]) -> UsageError | None:
    """A flag a --flagfile gives in shell quotes, which absl keeps: --output_root="/x" there
    would train in ./"/x"."""
    if not _flagfiles(argv):
        return None
    for name in flags.FLAGS:
        value = flags.FLAGS[name].value
        # A list flag's text, as the file gives it: --roles='chief,ps' is ["'chief", "ps'"].
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            value = ",".join(value)
        if flags.FLAGS[name].present and isinstance(value, str):
            quoted = _quoted(name, value, argv)
            if quoted is not None:
                return quoted
    return None


def _quoted(name: str, value: str, argv: Sequence[str]) -> UsageError | None:
    """The error for a flag's value in shell quotes from a flag file, else None."""
    if len(value) < 2 or value[0] != value[-1] or value[0] not in "'\"":
        return None
    files = _in_flagfile(name, argv, value)
    if not files:
        return None
    return UsageError(
        f"--{name}{files}",
        f"is {value}, its quotes included: a flag file takes no shell quoting",
        f"write --{name}={value[1:-1]} there",
    )


def _flagfiles(argv: Sequence[str]) -> str:
    """The words ` (in --flagfile=F)` naming the flag files of a command line, if any."""
    files = [
        word.partition("=")[2] or (argv[at + 1] if at + 1 < len(argv) else "")
        for at, word in enumerate(argv)
        if re.match(r"--?flagfile(=|$)", word)
    ]
    return f" (in --flagfile={', '.join(files)})" if files else ""

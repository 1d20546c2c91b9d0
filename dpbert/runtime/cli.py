"""What every launcher (`launch/*.py`) shares: one-line errors and a readable console.

    from dpbert.runtime import cli
    ...
    if __name__ == "__main__":
        cli.run(main, "train")

`run` is `absl.app.run` with four differences, so that a new user's first mistakes each get ONE
clear line instead of a traceback or a page of help:

* `--help` (and `-h`, `--helpshort`, `--helpfull`) print the help and exit 0 (absl exits 1);
* a bad flag, a missing (or empty, or FIFO) `--config` file, one that fails to import or whose
  get_config raises or returns no ConfigDict (named with file and line), an unknown config
  field (absl's "did you mean" hint kept), a config field given twice (`repeated_overrides`:
  refused, not decided by the order of the flags), a bad `configs/x.py:ARG`, or an
  `app.UsageError` raised by `main` print `NAME: error: ...` on one line and exit 2;
* log lines of jax/orbax below WARNING are dropped (e.g. "Unable to initialize backend 'tpu':
  ... libtpu.so ..." on every CPU run);
* a log line written while a tqdm progress bar is on screen clears the bar, prints the line, and
  redraws the bar below it, so bars and log lines never share a line.

The path checks every launcher shares live here too (`check_output_dir`, `check_output_path`,
`check_input_path`, `check_config_inputs`, on `data_pipelines.fileio`): an empty path, the
current directory, an output that is, lies inside or holds a source, a FIFO input.

This module imports only absl, the standard library and `data_pipelines.fileio` (`--help` stays
instant).
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import re
import sys
from typing import Callable, Sequence

from absl import app, flags
from absl import logging

from data_pipelines import fileio

HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort", "--helpfull",
              "-helpfull")
# Library code whose INFO/DEBUG log lines are noise on the console.
_NOISY_PATHS = ("/orbax/", "/jax/", "/jaxlib/", "/flax/")
_NOISY_LOGGERS = ("jax", "jaxlib", "orbax", "flax")


USAGE, BAD_INPUT = 2, 1  # the launchers' exit codes (docs/bad_inputs.md)


def fail(name: str, message: str, code: int = USAGE) -> None:
    """The one way a launcher stops on a problem: one line on stderr, then exit `code`.

    USAGE (2: a bad flag, config field or path, found before any work): `NAME: error: MSG`.
    BAD_INPUT (1: a problem the library found in the input or the run): `NAME: MSG`.
    """
    prefix = f"{name}: error: " if code == USAGE else f"{name}: "
    print(prefix + one_line(message), file=sys.stderr)
    sys.exit(code)


def one_line(message: str) -> str:
    """A multi-line message (a nested traceback, a config loader's report) as one line: the
    last `SomeError: text` line if there is one, else the lines joined with '; '."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return str(message)
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", ln)]
    if errors:
        return errors[-1].split(": ", 1)[1]
    return "; ".join(lines)


def run(main: Callable[[list[str]], object], name: str,
        argv: Sequence[str] | None = None) -> None:
    """`absl.app.run(main)` with one-line errors and a quiet console (see the module doc);
    `argv` defaults to sys.argv."""

    def wrapped(argv: list[str]) -> object:
        setup_console()
        try:
            return main(argv)
        except app.UsageError as e:
            fail(name, f"{e} (see --help)")
        return None

    app.run(wrapped, argv=None if argv is None else list(argv),
            flags_parser=lambda args: parse_flags(args, name))


def parse_flags(argv: Sequence[str], name: str) -> list[str]:
    """Parses flags like absl, but every problem is one line (exit 2) and --help exits 0."""
    args = list(argv)
    if any(a in HELP_FLAGS for a in args[1:]):
        # absl's own help flags exit 1; a help request is not an error.
        full = any(a.lstrip("-") == "helpfull" for a in args[1:])
        app.usage(shorthelp=not full, writeto_stdout=True, exitcode=0)
    _check_config_files(args, name)
    repeated = repeated_overrides(args[1:], _config_flag_names())
    if repeated:
        fail(name, repeated)
    parsed, unset = _pop_none_overrides(args)
    try:
        with _no_returned_none_warning():
            rest = flags.FLAGS(parsed)
        # config_flags defers a failed config load (a missing file, an exception in
        # get_config) until the value is read; read it now, while errors are still flag errors.
        for flag in flags.FLAGS._flags().values():  # noqa: SLF001 - no public iterator
            if type(flag).__name__ == "_ConfigFlag":
                value = flag.value
                problem = _not_a_config(value)
                if problem and flag.present:
                    fail(name, f"--{flag.name}={_given_config(args, flag.name)}: {problem}")
                _set_none(flag.name, value, unset.get(flag.name, ()))
        return rest
    except flags.Error as e:
        if "--config=None" in str(e) and _given_config(args, "config"):
            # get_config() returned None: config_flags reports a missing flag
            fail(name, f"--config={_given_config(args, 'config')}: {_not_a_config(None)}")
        fail(name, f"{one_line(str(e))} (see --help)")
    except Exception as e:  # noqa: BLE001 - every failure of a config file becomes one line
        in_file = _config_file_error(e, args)
        if in_file:
            fail(name, in_file)
        if isinstance(e, (AttributeError, KeyError)):
            fail(name, _unknown_field_message(e, args))
        if isinstance(e, (OSError, ValueError, TypeError)):
            fail(name, one_line(str(e)))
        raise
    raise AssertionError("unreachable")


def _given_config(args: Sequence[str], flag: str) -> str | None:
    """The value of `--FLAG=VALUE` (or `--FLAG VALUE`) in `args`, None if absent."""
    for i, a in enumerate(args):
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
        if a == f"--{flag}" and i + 1 < len(args):
            return args[i + 1]
    return None


def _not_a_config(value) -> str | None:
    """Why a config file's get_config() result is not a config (None when it is one)."""
    if value is None:
        return "get_config() returned None (a missing return statement?); it must return an " \
               "ml_collections.ConfigDict"
    if not (hasattr(value, "to_dict") and hasattr(value, "lock")):  # ConfigDict, FrozenConfigDict
        return (f"get_config() returned a {type(value).__name__}, not an ml_collections."
                "ConfigDict (e.g. `return ml_collections.ConfigDict(...)`)")
    return None


def _config_file_error(e: BaseException, args: Sequence[str]) -> str | None:
    """One line for an exception raised by a config file itself (a syntax error, a failing
    import, an error in get_config), naming the file and line; None for other errors. A
    ValueError whose message already names the file (a bad `configs/x.py:ARG`, from
    `configs.common.parse_arg`) is left as it is."""
    value = _given_config(args, "config")
    if value is None:
        return None
    path = value.split(":", 1)[0]
    real = os.path.realpath(path)
    if isinstance(e, SyntaxError) and e.filename and os.path.realpath(e.filename) == real:
        return (f"--config={value}: {path}, line {e.lineno}: {type(e).__name__}: {e.msg} "
                "(the config file cannot be imported)")
    frames = [f for f in _traceback_frames(e) if os.path.realpath(f[0]) == real]
    if not frames or (isinstance(e, ValueError) and os.path.basename(path) in str(e)):
        return None
    _, line, function = frames[-1]
    what = "importing it" if function == "<module>" else f"{function}()"
    return (f"--config={value}: {what} raised {type(e).__name__}: {one_line(str(e))} "
            f"({path}, line {line})")


def _traceback_frames(e: BaseException) -> list[tuple[str, int, str]]:
    """(file, line, function) of every frame of `e`'s traceback, outermost first."""
    out, tb = [], e.__traceback__
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


class _DropReturnedNone(std_logging.Filter):
    def filter(self, record: std_logging.LogRecord) -> bool:
        return not (record.pathname.endswith("config_flags.py")
                    and "returned None" in str(record.msg))


@contextlib.contextmanager
def _no_returned_none_warning():
    """config_flags logs a warning when get_config() returns None, then fails on a missing
    flag; parse_flags says both in its one line instead."""
    handlers = [h for h in std_logging.root.handlers] + [logging.get_absl_handler()]
    drop = _DropReturnedNone()
    logger = std_logging.getLogger("absl")
    logger.addFilter(drop)
    for h in handlers:
        h.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
        for h in handlers:
            h.removeFilter(drop)


def _config_flag_names() -> tuple[str, ...]:
    """Names of the defined config_flags flags (`--config`), whose fields `--config.X.Y`
    override."""
    return tuple(name for name, flag in flags.FLAGS._flags().items()  # noqa: SLF001
                 if type(flag).__name__ == "_ConfigFlag")


def _override(arg: str, following: str | None,
              config_flags: Sequence[str]) -> tuple[str, str] | None:
    """(dotted field with its flag, value as given) of a config override `arg`
    (`--config.dp.delta=1e-5`, `--config.dp.delta 1e-5`, `--config.train.flag`,
    `--noconfig.train.flag`; one or two leading dashes), or None for any other argument.
    `following` is the next argument (the value of the spaced form)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    key, eq, value = arg.lstrip("-").partition("=")
    negated = False
    if key.startswith("no") and key[2:].split(".", 1)[0] in config_flags and "." in key:
        key, negated = key[2:], True
    flag = key.split(".", 1)[0]
    if flag not in config_flags or "." not in key:
        return None
    if negated:
        return key, "False"
    if eq:
        return key, value
    if following is not None and not following.startswith("-"):
        return key, following
    return key, "True"


def repeated_overrides(args: Sequence[str], config_flags: Sequence[str] = ("config",)
                       ) -> str | None:
    """One line naming the first config field given twice in `args` (the command line without
    the program name) and both values, or None when each field is given once.

    A repeated field is refused rather than resolved: a command line whose earlier override
    is silently replaced by a later one (e.g. a script that appends to a base command) runs
    with a setting its author did not read, and a privacy setting (dp.target_epsilon,
    dp.noise_multiplier) must never be decided by argument order. A field given with one of
    its sections (`--config.data.canaries=None` and `--config.data.canaries.enabled=True`) is
    the same conflict."""
    seen: dict[str, tuple[str, str]] = {}
    for i, arg in enumerate(args):
        if arg == "--":
            break
        found = _override(arg, args[i + 1] if i + 1 < len(args) else None, config_flags)
        if found is None:
            continue
        key, value = found
        for other, (other_value, other_arg) in seen.items():
            if other == key:
                return (f"--{key} is given twice ({other_value!r}, then {value!r}); give each "
                        "config field once (which one counts would depend on the order of "
                        "the flags)")
            if key.startswith(other + ".") or other.startswith(key + "."):
                return (f"{other_arg} and {arg} set a config section and a field inside "
                        "it; give each config field once (which one counts would depend on "
                        "the order of the flags)")
        seen[key] = (value, arg)
    return None


def _pop_none_overrides(args: list[str]) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """`--config.dp.noise_multiplier=None` (or `none`): config_flags parses the value with the
    field's type (float('None') fails), so such overrides are taken out of argv and applied
    after parsing (`_set_none`). Returns (the other args, {flag name: [(dotted field, value
    as given)]})."""
    rest, unset = [], {}
    for a in args:
        key, eq, value = a.partition("=")
        if a.startswith("--") and eq and value.strip().lower() == "none" and "." in key:
            flag, field = key[2:].split(".", 1)
            if flag in flags.FLAGS and type(flags.FLAGS[flag]).__name__ == "_ConfigFlag":
                unset.setdefault(flag, []).append((field, value))
                continue
        rest.append(a)
    return rest, unset


def _set_none(flag: str, config, fields: Sequence[tuple[str, str]]) -> None:
    """Sets each dotted field of `fields` ((field, value as given) pairs) of `config` to None,
    except a string field, which takes the value as given (`--config.privacy.mode=none` is the
    mode "none"). A missing field is a KeyError, which parse_flags reports like any unknown
    field."""
    for field, value in fields:
        *parents, leaf = field.split(".")
        node = config
        for part in parents:
            node = getattr(node, part)
        if leaf not in node:
            raise AttributeError(leaf)
        setattr(node, leaf, value if _is_string_field(node, leaf) else None)


def _is_string_field(node, leaf: str) -> bool:
    try:
        kind = node.get_type(leaf)
    except (AttributeError, KeyError, TypeError):
        kind = type(getattr(node, leaf))
    return isinstance(kind, type) and issubclass(kind, str)


def _check_config_files(args: Sequence[str], name: str) -> None:
    """`--config=PATH[:ARG]` whose PATH is missing: one line naming it."""
    for i, a in enumerate(args):
        value = None
        if a.startswith("--config="):
            value = a.split("=", 1)[1]
        elif a == "--config" and i + 1 < len(args):
            value = args[i + 1]
        if value is None:
            continue
        path = value.split(":", 1)[0]
        if not path.strip():
            fail(name, f"--config={value}: empty path; give a config file (e.g. "
                       "configs/demo_dp.py)")
        if os.path.isdir(path):
            fail(name, f"--config={value}: {path} is a directory; give a config file "
                       "(e.g. configs/demo_dp.py)")
        special = fileio.special_file_problem(path)
        if special:
            fail(name, f"--config={value}: {path} {special}")
        if not os.path.isfile(path):
            fail(name, f"--config={value}: config file {path} not found (configs/*.py)")


def _unknown_field_message(e: BaseException, args: Sequence[str]) -> str:
    """`--config.dp.noise_multiplierr=2` -> one line naming the override and absl's hint."""
    text = str(e.args[0] if e.args else e).replace("\\n", "\n").replace("\\'", "'")
    text = text.strip("'\" \n")
    lines = [ln.strip("'\" ") for ln in text.splitlines() if ln.strip("'\" ")]
    key = lines[0] if lines else "?"
    hint = next((ln for ln in lines if ln.lower().startswith("did you mean")), "")
    override = next((a.split("=", 1)[0] for a in args
                     if a.startswith("--config.") and key in a.split("=", 1)[0].split(".")),
                    "")
    where = f"{override}: " if override else ""
    return (f"{where}unknown config field {key!r}"
            + (f"; {hint[0].lower()}{hint[1:]}" if hint else "")
            + " (fields: see the config file and configs/common.py)")


# dp_accounting's RDP accountant warns of numerical trouble at extreme orders while dpbert's
# calibration and budget searches probe far-off noise multipliers (dozens per run, even with
# the PLD accountant, whose searches start from an RDP estimate); every number dpbert reports
# is re-checked with a fresh accountant, so these are noise on the console.
_RDP_PROBE_WARNINGS = ("rdp_privacy_accountant.py",)


class _QuietLibraries(std_logging.Filter):
    """Drops INFO/DEBUG records from jax/orbax/flax (kept: WARNING and above), and the RDP
    accountant's probe warnings below ERROR."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.pathname.endswith(_RDP_PROBE_WARNINGS) and record.levelno < std_logging.ERROR:
            return False
        if record.levelno >= std_logging.WARNING:
            return True
        if record.name.split(".")[0] in _NOISY_LOGGERS:
            return False
        return not any(p in record.pathname for p in _NOISY_PATHS)


def setup_console() -> None:
    """Quiet library logs; keep log lines and tqdm progress bars on separate lines."""
    handler = logging.get_absl_handler()
    # A handler filter sees records of every logger (jax's own logger propagates to the root
    # logger where absl's handler sits); a logger filter would not.
    if not any(isinstance(f, _QuietLibraries) for f in handler.filters):
        handler.addFilter(_QuietLibraries())
    # absl's handler hands each record to its python handler's handle(), which calls that
    # handler's emit: wrap that one.
    target = handler.python_handler
    if getattr(target.emit, "_tqdm_safe", False):
        return
    emit = target.emit

    def tqdm_safe_emit(record: std_logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")  # only if some code uses tqdm already
        if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
            emit(record)
            return
        # Clears the bars on stderr, writes the line, redraws the bars below it.
        with tqdm.tqdm.external_write_mode(file=sys.stderr):
            emit(record)

    tqdm_safe_emit._tqdm_safe = True  # type: ignore[attr-defined]
    target.emit = tqdm_safe_emit  # type: ignore[method-assign]


def check_output_dir(path: str | None, flag: str, *, must_be_empty: bool = False,
                     sources: Sequence[tuple[str, str]] = (),
                     inside_sources_ok: bool = False) -> str | None:
    """Why `path` cannot be an output folder (None if it can), as `FLAG=PATH: why`: empty, the
    current directory (or a folder holding it), a folder that is, lies inside or holds one of
    `sources` ((name, path) pairs of the command's inputs, `fileio.path_problem`), a file, a
    read-only folder, or a parent that is a file or read-only. With `must_be_empty`, a non-empty
    folder too. Remote paths (gs://...) are checked for emptiness only."""
    problem = fileio.output_folder_problem(path, sources=sources,
                                           inside_sources_ok=inside_sources_ok)
    if problem:
        return f"{flag}={path}: {problem}"
    if "://" in path:
        return None
    if must_be_empty and os.path.isdir(path) and os.listdir(path):
        return f"{flag}={path}: is not empty"
    return None


def check_output_path(path: str | None, flag: str, *, sources: Sequence[tuple[str, str]] = (),
                      inside_sources_ok: bool = False) -> str | None:
    """`FLAG=PATH: why` when `path` is a degenerate output (`fileio.path_problem`: empty, the
    current directory or a folder holding it, a source's folder), else None."""
    problem = fileio.path_problem(path, sources=sources, inside_sources_ok=inside_sources_ok)
    return f"{flag}={path}: {problem}" if problem else None


# Config fields that name input files or folders (checked by `check_config_inputs`).
CONFIG_INPUT_FIELDS = ("data.paths", "data.train", "data.eval", "vocab.file",
                       "model.init_from_hf", "data.canaries.file", "privacy.public_file")
# Those that name a Hugging Face model folder (a training workdir there is refused by name).
CONFIG_MODEL_FIELDS = ("model.init_from_hf",)


def check_config_inputs(config, fields: Sequence[str] = CONFIG_INPUT_FIELDS) -> str | None:
    """`config.FIELD=PATH: why` for the first input path of `config` (the dotted `fields` it
    has; a field may hold a list of paths) that is a FIFO, a socket or a device, or, for a
    model folder (`CONFIG_MODEL_FIELDS`), a training workdir (`check_model_folder`); None if
    there is none. Missing files are left to the readers, which name them."""
    for field in fields:
        node = config
        for part in field.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        paths = node if isinstance(node, (list, tuple)) else [node]
        for path in paths:
            if isinstance(path, str) and path:
                problem = fileio.special_file_problem(path)
                if problem:
                    return f"config.{field}={path}: {problem}"
                if field in CONFIG_MODEL_FIELDS:
                    problem = check_model_folder(path, f"config.{field}")
                    if problem:
                        return problem
    return None


def check_model_folder(path: str | None, flag: str) -> str | None:
    """`FLAG=PATH: PATH is a dpbert training workdir; its model is PATH/hf` when a training
    workdir is given where a Hugging Face model folder is expected
    (`fileio.training_workdir_problem`), else None (other problems: the model readers)."""
    problem = fileio.training_workdir_problem(path)
    return f"{flag}={path}: {problem}" if problem else None


def check_input_path(path: str | None, flag: str) -> str | None:
    """Why `path` cannot be an input (None if it can, or if it is missing: the reader names it
    then): empty (which would mean the current directory), or a FIFO, socket or device."""
    if path is None or not str(path).strip():
        return f"{flag}= is empty; give a path"
    problem = fileio.special_file_problem(path)
    return f"{flag}={path}: {problem}" if problem else None

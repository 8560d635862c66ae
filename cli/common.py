"""What every ``engine`` command shares: consoles, one-line errors, option types, KEY=VALUE parsing, progress
and the plugin lists (the result tables are ``tables.py``)."""

from __future__ import annotations

import functools
import math
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvsched.errors import KvschedError, error_text, quote, shorten

PIPED_WIDTH = 1_000  # columns of output that is not a terminal's: rich would cut a table at 80 and fold its cells


def _console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or, writing to a pipe or a file, wide enough for any table."""
    shown = Console(stderr=stderr)
    return shown if shown.is_terminal else Console(stderr=stderr, width=PIPED_WIDTH)


console = _console()
err_console = _console(stderr=True)


def flag(*names: str, help: str, **options):
    """A boolean option that is a flag, given or not: shown without a value (``--quiet``, not
    ``--quiet <bool>``), as it takes none."""
    return typer.Option(*names, help=help, metavar="", **options)


PolicyOpt = Annotated[
    str, typer.Option("--policy", "-p", help="policy name (see `engine policies`), or path/to/file.py:Class")
]
PolicyOptions = Annotated[
    list[str] | None, typer.Option("--policy-opt", help="policy constructor option KEY=VALUE (repeatable)")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="engine config override KEY=VALUE (repeatable), e.g. delay_factor=0.5"),
]
SeedOpt = Annotated[int, typer.Option(help="workload seed")]
NumOpt = Annotated[
    int | None,
    typer.Option(
        "--num-requests", "-n", help="requests of the default or synthetic workload, or the first N of a trace"
    ),
]
RateOpt = Annotated[
    float | None,
    typer.Option(help="mean arrival rate, requests/s (Poisson; on a trace it replaces the recorded arrival times)"),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="results folder: summary.json, requests.csv/.parquet, timeseries.parquet"),
]
ProfileOpt = Annotated[str, typer.Option(help="simulator cost profile: a name, or a .json file from engine calibrate")]
QuietOpt = Annotated[
    bool,
    flag(
        "--quiet", "-q", help="no progress (bars and status lines on stderr); results, warnings and errors still print"
    ),
]
DebugOpt = Annotated[
    bool,
    flag(
        "--debug",
        envvar="KVSCHED_DEBUG",
        help="show the whole traceback of an error (anywhere on the line; or KVSCHED_DEBUG=1)",
    ),
]


def fail(message: str, code: int = 2) -> None:
    error_line(message)
    raise typer.Exit(code)


def given_options(ctx: typer.Context) -> set[str]:
    """The parameters given on ``ctx``'s command line: not left at their defaults, nor taken from the environment
    (``OPENAI_API_KEY`` is the user's setting, not a choice made for this command)."""
    sources = {name: ctx.get_parameter_source(name) for name in ctx.params}  # typer's own click: compared by name
    return {name for name, source in sources.items() if source is not None and source.name == "COMMANDLINE"}


def refuse_unread(ctx: typer.Context, names: Collection[str], mode: str) -> None:
    """Refuse the first option of ``names`` (parameter names) given on ``ctx``'s command line: ``mode``
    (``to a fleet: ...``, read after "does not apply") does not read it, and an option taken and then
    ignored gives results the user did not ask for. One line, exit 2."""
    given = given_options(ctx)
    for param in ctx.command.params:
        if param.name in names and param.name in given:
            fail(f"{'/'.join([param.opts[0], *param.secondary_opts])} does not apply {mode}")


def error_line(message: str) -> None:
    """``error: message`` on stderr, on one line however long the message (cut at 1,000 characters)."""
    err_console.print(
        f"[bold red]error:[/] {escape(shorten(one_line(message), 1000))}", highlight=False, soft_wrap=True
    )


_LINE_BREAKS = re.compile(r"\s*[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")


def one_line(text: str) -> str:
    """``text`` as one printable line: line breaks (a pydantic error's, a traceback's) become `` · ``,
    other control characters and lone surrogates ``\\x..`` escapes, so no terminal or encoding
    can make the error printer itself fail or the message span lines."""
    text = _LINE_BREAKS.sub(" · ", str(text).strip())
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def debugging() -> bool:
    """``engine --debug`` or ``KVSCHED_DEBUG=1``: errors come with their whole traceback."""
    return os.environ.get("KVSCHED_DEBUG", "") not in ("", "0")


def cli_errors(fn):
    """Turn every error into one clear line: exit status 2 for bad input, 1 for anything unforeseen
    (never a traceback, unless ``debugging()``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if debugging():
                traceback.print_exception(exc)
            fail(*_one_line(exc))

    return wrapper


def _one_line(exc: Exception) -> tuple[str, int]:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or exc.title
        given = f" (got {quote(first['input'])})" if "input" in first and not isinstance(first["input"], dict) else ""
        return f"invalid {exc.title}: {field}: {first['msg']}{given}", 2
    if isinstance(exc, KvschedError):
        return str(exc), 2
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc) or repr(exc), 2
    if isinstance(
        exc, (KeyError, ValueError)
    ):  # a KeyError's str() quotes its message; a UnicodeError's first argument is a codec's name
        plain = isinstance(exc, KeyError) and len(exc.args) == 1
        return error_text(Exception(exc.args[0]) if plain else exc, 1000) if exc.args else repr(exc), 2
    return f"unexpected {type(exc).__name__}: {error_text(exc, 1000)} (KVSCHED_DEBUG=1 shows the traceback)", 1


def input_files(workload=None, trace=None, profile=None, policies=(), built=None) -> dict[str, Path | None]:
    """The files a command reads, by option (for ``check_apart``): a ``.json`` workload spec or cost
    profile, the trace, a policy's ``file.py``, and the trace a built workload replays (a spec's, a
    built-in's)."""
    files: dict[str, Path | None] = {
        "--trace": trace,
        "--workload": Path(workload) if str(workload).endswith(".json") else None,
        "--profile": Path(profile) if str(profile).endswith(".json") else None,
        "the workload's trace": getattr(built, "path", None),
    }
    for spec in policies:
        source = str(spec).split(":", 1)[0]
        files[f"--policy {spec}"] = Path(source) if source.endswith(".py") else None
    return files


def check_finite(**options: float | None) -> None:
    """Float options (by name, ``slo_ttft=...``) must be finite numbers: typer's bounds let NaN through."""
    for name, value in options.items():
        if value is not None and not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} must be a finite number, got {value}")


def parse_pairs(pairs: list[str] | None, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values stay strings for pydantic to validate and coerce. A key
    given twice is refused: one of its values would be dropped without a word."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} expects KEY=VALUE, got {pair!r}")
        key, value = key.strip(), value.strip()
        if key in out:
            raise ValueError(f"{what} {key} is given twice ({out[key]!r}, then {value!r}): give it once")
        out[key] = value
    return out


def policy_options(spec: str, pairs: list[str] | dict[str, str] | None, prefix: str = "") -> dict[str, Any]:
    """``KEY=VALUE`` options for the policy ``spec`` (loaded: an unknown policy fails here), each
    checked against its constructor: an option it does not take, or a value its annotation refuses,
    is named (as ``--policy-opt PREFIX KEY=VALUE``; compare's prefix is ``POLICY.``) before any work starts. They are
    returned as given, since they label runs and results: the engine converts them when it builds the policy."""
    import inspect

    from kvsched.plugins.discovery import load_policy, policy_name
    from kvsched.plugins.options import OptionError, checked_options

    policy = load_policy(spec)
    name = policy_name(spec, policy)
    options = pairs if isinstance(pairs, dict) else parse_pairs(pairs, "--policy-opt")
    if not options or not inspect.isclass(policy):
        return options  # a policy that is not a class takes no options: the engine's check says so
    try:
        checked_options(policy, options, name)
    except OptionError as exc:
        given = f"--policy-opt {prefix}{exc.key}={exc.value}"
        if exc.hint is None:
            raise ValueError(f"{given}: policy {name} {exc.reason}") from None
        raise ValueError(f"{given}: {exc.reason} (policy {name}'s option {exc.key} is {type_name(exc.hint)})") from None
    return options


def type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def build_config(overrides: list[str] | None, option: str = "--set"):
    """The ``EngineConfig`` of ``KEY=VALUE`` settings; what they leave unset is not marked as set
    (``SimJob`` fills it from the profile)."""
    from kvsched.core.config import EngineConfig
    from kvsched.executors.settings import check_names

    pairs = parse_pairs(overrides, option)
    check_names(pairs, option)
    return EngineConfig.model_validate(pairs)


@contextmanager
def working(quiet: bool, doing: str) -> Iterator[None]:
    """``doing`` with a spinner and the time so far (on a terminal), then one line saying how long it
    took; nothing with ``quiet``. For a step with no count to show, such as loading a model."""
    if quiet:
        yield
        return
    start = time.perf_counter()
    with Progress(
        SpinnerColumn(), TextColumn(f"[bold]{escape(doing)}"), TimeElapsedColumn(), console=err_console, transient=True
    ):
        yield
    err_console.print(f"{doing}: {time.perf_counter() - start:.1f} s", highlight=False)


def progress_bar(quiet: bool, doing: str = "simulating", counting: str = "requests") -> Progress:
    return Progress(
        TextColumn(f"[bold]{doing}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(counting),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    )


def print_plugins(kind: str, infos: Iterable[Any], describe: Callable[[str], str]) -> None:
    """``engine policies`` or ``engine routers``: a table of the installed plugins of ``kind`` (their
    ``PolicyInfo``s), each described by ``describe(spec)``; one that fails to load says why in its row,
    so that a broken third-party plugin does not hide the others (a ``KeyboardInterrupt`` its import raises
    too: only a real Ctrl-C, SIGINT, ends the listing). A name that several distributions register is
    listed as DIST:NAME, each, with a warning that says how to choose."""
    from kvsched.plugins.boundary import exception_text
    from kvsched.plugins.discovery import GROUPS

    group = GROUPS[kind]
    table = Table(title=f"installed {group.removeprefix('kvsched.')} (entry-point group {group})")
    for col in ("name", "distribution", "version", "description"):
        table.add_column(col, overflow="fold")
    infos = list(infos)
    with _interrupts() as pressed:
        for info in infos:
            try:
                text = describe(info.spec)
            except KvschedError as exc:
                text = f"(fails to load: {exc})"
            except KeyboardInterrupt as exc:
                if pressed:
                    raise
                text = f"(fails to load: {exception_text(exc)})"
            table.add_row(info.spec, info.distribution, info.version, text)
    console.print(table)
    for name in sorted({i.name for i in infos if i.ambiguous}):
        dists = " and ".join(i.distribution for i in infos if i.name == name)
        console.print(
            f"[bold yellow]warning:[/] {name} is registered by {dists}: choose one with --{kind} DIST:{name}",
            highlight=False,
        )


@contextmanager
def _interrupts() -> Iterator[list[int]]:
    """A list that holds the signal once Ctrl-C is pressed (SIGINT then raises ``KeyboardInterrupt`` as
    Python's own handler does): a ``KeyboardInterrupt`` while it is empty was raised by code, not by the user.
    Outside the main thread no handler can be set: every one counts as the user's."""
    if threading.current_thread() is not threading.main_thread():
        yield [signal.SIGINT]
        return
    pressed: list[int] = []

    def handler(signum, frame):
        pressed.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)

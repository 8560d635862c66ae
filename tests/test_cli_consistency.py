"""One consistent CLI: every option explained, flags that are flags, -q and --plot meaning one thing everywhere."""

import subprocess
import sys
from pathlib import Path

import typer.main

from kvsched.cli.app import app

ENGINE = str(Path(sys.executable).parent / "engine")
ROOT = Path(__file__).resolve().parents[1]
GROUP = typer.main.get_command(app)
COMMANDS = {"engine": GROUP, **GROUP.commands}
SHOWS_PROGRESS = ("engine", "run", "sweep", "compare", "check", "bench", "verify", "validate")


def engine(*args, cwd=ROOT):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_every_option_says_what_it_does():
    missing = [
        f"{name} {param.opts[0]}" for name, command in COMMANDS.items() for param in command.params if not param.help
    ]
    assert not missing


def test_boolean_options_are_flags_shown_without_a_value():
    shown = [
        f"{name} {p.opts[0]}"
        for name, command in COMMANDS.items()
        for p in command.params
        if getattr(p, "is_flag", False) and p.metavar != ""
    ]
    assert not shown
    help_text = engine("run", "--help").stdout
    assert [line for line in help_text.splitlines() if "<bool>" in line and "--help" not in line] == []


def test_quiet_is_accepted_wherever_progress_is_shown():
    for name in SHOWS_PROGRESS:
        assert "-q" in {o for p in COMMANDS[name].params for o in p.opts}, name


def test_run_and_verify_default_to_the_same_model():
    defaults = {
        name: next(p.default for p in COMMANDS[name].params if "--model" in p.opts) for name in ("run", "verify")
    }
    assert defaults == {"run": "smollm2-135m", "verify": "smollm2-135m"}


def test_plot_is_a_flag_that_writes_under_output_in_run_and_compare(tmp_path):
    for name in ("run", "compare"):
        (plot,) = [p for p in COMMANDS[name].params if "--plot" in p.opts]
        assert plot.is_flag, name
    proc = engine("compare", "-p", "fcfs", "-p", "sjf", "-n", "30", "--seeds", "1", "--plot", "-q")
    assert proc.returncode == 2 and "--plot needs --output DIR" in proc.stderr
    proc = engine(
        "compare", "-p", "fcfs", "-p", "sjf", "-n", "30", "--seeds", "1", "-o", tmp_path / "cmp", "--plot", "-q"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # -q: no progress bar
    csv = (tmp_path / "cmp" / "comparison.csv").read_text().splitlines()
    assert csv[0] == "metric,fcfs,sjf,sjf vs fcfs" and csv[2] == "finished,30,30,same"  # the first row ranks
    assert (tmp_path / "cmp" / "comparison_cdf.png").stat().st_size > 10_000


def test_quiet_hides_progress_not_results():
    proc = engine("run", "-n", "20", "-q")
    assert proc.returncode == 0 and "requests (finished / ignored / aborted)" in proc.stdout and proc.stderr == ""
    proc = engine("check", "--policy", "fcfs", "--examples", "3", "--steps", "3", "--starvation-examples", "1", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "conformance of fcfs" in proc.stdout and proc.stderr == ""

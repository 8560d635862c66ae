"""``report.html`` in a real browser: headless Chromium (Debian's ``chromium``) opens it from disk with
networking off, runs its JavaScript, and every chart must render without a JavaScript error; a
screenshot is left in the test's temporary folder. Skipped where Chromium is not installed."""

import re
import shutil
import subprocess
import sys
from itertools import count
from pathlib import Path

import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=20000",
)
_profiles = count()

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian: apt-get install chromium "
    "chromium-driver); the Makefile's test set-up installs it where it can",
)


def chromium(tmp_path: Path, *args) -> subprocess.CompletedProcess:
    """Chromium with a fresh profile, its console messages on stderr."""
    profile = tmp_path / f"profile-{next(_profiles)}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "out"
    proc = subprocess.run(
        [ENGINE, "run", "-q", "-n", "150", "--set", "num_gpu_blocks=400", "--output", str(out), "--plot"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out / "report.html"


def test_every_chart_renders_without_javascript_errors(report, tmp_path):
    page = report.read_text()
    markup = re.sub(
        r"<script[^>]*>.*?</script>", "", page, flags=re.S
    )  # (Plotly's bundle names URLs it never loads here)
    assert "<script src" not in page and not re.search(r"""(src|href)=["']https?:""", markup), (
        "one file: nothing from the network"
    )
    charts = re.findall(r'<div class="chart" id="([^"]+)"></div>', page)
    assert len(charts) == 9
    proc = chromium(tmp_path, "--dump-dom", report.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    dom = proc.stdout
    assert f'data-charts-rendered="{len(charts)}"' in dom  # set once every Plotly.newPlot has resolved
    assert re.search(r'<div id="js-errors" hidden="">\s*</div>', dom), "the page caught a JavaScript error"
    for key in charts:  # Plotly drew into each chart's element
        assert re.search(rf'<div class="chart js-plotly-plot" id="{key}">.*?class="main-svg"', dom, re.S), key
    assert dom.count('<details id="explain-') == page.count('<details id="explain-') > 0


def test_a_screenshot_of_the_report(report, tmp_path):
    shot = tmp_path / "report.png"
    proc = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3000", "--hide-scrollbars", report.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # charts, not a blank page


def test_a_policy_name_and_folder_that_hold_markup_leave_the_report_whole(tmp_path):
    """Every page escapes what it embeds: a name holding </script> or <!--<script> (the HTML parser's
    "double-escaped" state, where a script element's end is not its end) must not cut its script short."""
    hostile = "<!--<script>&amp;"
    folder = tmp_path / f"run{hostile}"
    folder.mkdir()
    (folder / "policy.py").write_text(
        "from kvsched.policies.fcfs import Fcfs\n\n\nclass Mine(Fcfs):\n    name = 'mine</script><!--<script>'\n"
    )
    out = folder / "out"
    proc = subprocess.run(
        [ENGINE, "run", "-q", "-n", "40", "--policy", f"{folder}/policy.py:Mine", "--output", str(out), "--plot"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    page = (out / "report.html").read_text()
    scripts = re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert scripts and not any("<" in s or ">" in s for s in scripts)  # inlined JSON holds its markup as escapes only
    shown = chromium(tmp_path, "--dump-dom", (out / "report.html").as_uri())
    assert shown.returncode == 0, shown.stderr[-2000:]
    charts = re.findall(r'<div class="chart" id="([^"]+)"></div>', page)
    assert f'data-charts-rendered="{len(charts)}"' in shown.stdout
    assert re.search(r'<div id="js-errors" hidden="">\s*</div>', shown.stdout), "the page caught a JavaScript error"
    assert "kvsched run: mine&lt;/script&gt;&lt;!--&lt;script&gt;" in shown.stdout

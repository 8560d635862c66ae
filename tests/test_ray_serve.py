"""A kvsched router in Ray Serve in front of two real vLLM replicas (``engine serve`` on SmolLM2-135M).

Real Ray Serve, real vLLM on the CPU backend, real HTTP through the ``openai`` client and
``engine bench``; nothing is mocked. Two replicas of ``integrations/ray/fleet.py``'s ``EngineServe``
each start an ``engine serve`` process; ``KvschedRequestRouter`` running ``prefix-affinity``
routes. The checks: each session's turns (each turn's prompt extends the last) go to one replica,
the two sessions are served at all (the fleet answers), ``engine bench`` measures the fleet through
its one URL, and after ``stop_fleet`` no server process is left. Skipped, saying so, where ray,
vLLM or the model cannot be had; slow (two vLLM start-ups: minutes on two cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'kvsched[ray]')")
pytest.importorskip("vllm", reason="vLLM (the vllm extra) is not installed")
openai = pytest.importorskip("openai", reason="the openai client (the vllm extra) is not installed")

pytestmark = pytest.mark.slow
ENGINE = str(Path(sys.executable).with_name("engine"))


@pytest.fixture(scope="module")
def fleet():
    from kvsched.executors.hf_models import model_folder

    try:
        model_folder("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - the reason is the skip's
        pytest.skip(f"SmolLM2-135M is not available here: {exc}")
    from kvsched.experiments.ray_backend import start_ray
    from kvsched.integrations.ray.fleet import start_fleet, stop_fleet, wait_ready

    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pids: list[int] = []
    try:
        port = _free_port()
        url = start_fleet(port, replicas=2, router="prefix-affinity", policy="vllm-v1")
        wait_ready(url, timeout=900)
        handle = ray.serve.get_deployment_handle("EngineServe", app_name="kvsched-fleet")
        for _ in range(16):  # each call goes to some replica: until both have said their server's pid
            pids.append(handle.server_pid.remote().result())
            if len(set(pids)) == 2:
                break
        yield url, sorted(set(pids))
    finally:
        stop_fleet()
        ray.shutdown()
        left = [pid for pid in set(pids) if _alive(pid)]
        for pid in left:  # never leave a server behind, even when the check below fails
            os.killpg(pid, signal.SIGKILL)
        assert not left, f"engine serve processes {left} outlived the fleet"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sessions_turns_go_to_one_replica(fleet):
    url, pids = fleet
    assert len(pids) == 2, "the fleet has two replicas, each with its own server"
    where: dict[int, list[str]] = {}
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as client:
        for turn in range(4):
            for session in range(2):
                # each turn's prompt is the conversation so far: the last turn's prompt plus new tokens
                prompt = [2000 + 500 * session + k for k in range(48 + 32 * turn)]
                raw = client.completions.with_raw_response.create(model="smollm2-135m", prompt=prompt, max_tokens=4)
                assert raw.parse().choices[0].text is not None
                where.setdefault(session, []).append(raw.headers["x-kvsched-replica"])
    for session, replicas in where.items():
        assert len(set(replicas)) == 1, f"session {session}'s turns went to {replicas}"


def test_engine_bench_measures_the_fleet(fleet, tmp_path):
    url, _ = fleet
    # a synthetic workload (prompts given by length: engine bench sends ids of its own)
    workload = tmp_path / "small.json"
    fixed = lambda n: {"kind": "fixed", "value": n}  # noqa: E731
    workload.write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 6,
                "arrivals": {"kind": "poisson", "rate": 4.0},
                "prompt": fixed(64),
                "output": fixed(8),
                "seed": 1,
            }
        )
    )
    out = subprocess.run(
        [
            ENGINE,
            "bench",
            "--url",
            url,
            "--workload",
            str(workload),
            "--output",
            str(tmp_path / "b"),
            "-q",
            "--label",
            "ray-serve-fleet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["finished"] == 6 and summary["ttft_s"]["p50"] > 0


@pytest.mark.parametrize(
    "failure", [TimeoutError("HTTP proxies not available after 60s."), ray.exceptions.ActorDiedError()]
)
def test_a_proxy_slower_than_serves_fixed_waits_is_left_to_the_health_check(monkeypatch, failure):
    """Serve's 60 s wait for its first HTTP proxy ran out, and its controller killed a proxy slow to
    answer its ready check (the first wait then fails with ActorDiedError), in fresh-clone ``make
    test`` runs: the fleet connects to the controller it made instead of failing."""
    from kvsched.integrations.ray import fleet as fleet_module

    calls: list[dict] = []

    def start(**options):
        calls.append(options)
        if len(calls) == 1:
            raise failure

    monkeypatch.setattr(fleet_module.serve, "start", start)
    monkeypatch.setattr(fleet_module.serve, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(fleet_module, "build_fleet", lambda **kwargs: None)
    assert fleet_module.start_fleet(8123, replicas=2) == "http://127.0.0.1:8123/v1"
    assert [c["http_options"]["port"] for c in calls] == [8123, 8123]


def test_rays_own_prefix_router_sees_a_token_id_prompt_as_text_and_ours_its_ids():
    """Ray's PrefixCacheAffinityRouter compares characters and reads a list of ids as no text at all: the
    fleet's request body gives it one character per token id, so turns that extend a prompt extend its text."""
    from types import SimpleNamespace

    from ray.serve.llm.request_router import PrefixCacheAffinityRouter

    from kvsched.integrations.ray.fleet import CompletionBody
    from kvsched.integrations.ray.router import prompt_ids

    ray_router = object.__new__(PrefixCacheAffinityRouter)  # only its text extraction is used
    first, longer = [1000, 1001, 1002], [1000, 1001, 1002, 2000, 2001]
    texts = [
        ray_router._extract_text_from_request(SimpleNamespace(args=[CompletionBody({"prompt": p})]))
        for p in (first, longer)
    ]
    assert texts[0] and texts[1].startswith(texts[0]) and len(texts[1]) == 5
    assert prompt_ids(SimpleNamespace(args=[CompletionBody({"prompt": longer})], kwargs={})) == longer
    assert (
        ray_router._extract_text_from_request(SimpleNamespace(args=[CompletionBody({"prompt": "a text"})])) == "a text"
    )

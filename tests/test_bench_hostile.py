"""``engine bench`` against a server that lies: a real HTTP server (the standard library's) speaking the
OpenAI streaming protocol, whose usage figures and finish reasons are made up. No bogus figure may
reach the results, and the server may be given as its root or as its ``/v1`` base."""

from __future__ import annotations

import csv
import itertools
import json
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ENGINE = Path(sys.executable).with_name("engine")
MODEL = "liar"


class Liar(BaseHTTPRequestHandler):
    """Streams ``max_tokens`` one-token chunks, then reports ``Liar.counts`` (in turn) as the completion tokens
    and ``Liar.reasons`` (in turn) as the finish reason; only ``/v1/...`` exists, as on vLLM."""

    counts = itertools.cycle([None])
    reasons = itertools.cycle(["length"])
    acts = itertools.cycle(["answer"])  # or "hang" (headers, then nothing), "empty" (usage only), "refuse" (HTTP 400)
    context: int | None = None  # the max_model_len /v1/models lists, as vLLM does
    lock = threading.Lock()
    prompts: list[tuple[int, ...]] = []  # every prompt received

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            return self.send_error(404)
        listed = {"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}
        self._json({"object": "list", "data": [{**listed, "max_model_len": Liar.context} if Liar.context else listed]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            return self.send_error(404)
        with Liar.lock:
            usage, finish, act = next(Liar.counts), next(Liar.reasons), next(Liar.acts)
            Liar.prompts.append(tuple(body["prompt"]))
        if act == "refuse":
            data = json.dumps(
                {
                    "error": {
                        "message": "This model's maximum context length is 32 tokens",
                        "type": "BadRequestError",
                        "code": 400,
                    }
                }
            ).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()
        if act == "hang":
            return time.sleep(30)
        n = 0 if act == "empty" else body["max_tokens"]  # vLLM's stream of a request its scheduler ignored
        for i in range(n):
            choice = {"index": 0, "text": " x", "logprobs": None, "finish_reason": finish if i == n - 1 else None}
            self._event({"id": "c", "object": "text_completion", "created": 0, "model": MODEL, "choices": [choice]})
        tokens = n if usage is None or act == "empty" else usage
        self._event(
            {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": MODEL,
                "choices": [],
                "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": 1},
            }
        )
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, data: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()


@pytest.fixture
def liar():
    Liar.counts, Liar.reasons = itertools.cycle([None]), itertools.cycle(["length"])
    Liar.acts = itertools.cycle(["answer"])
    Liar.context = None
    Liar.prompts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def workload(tmp_path):
    spec = tmp_path / "six.json"
    spec.write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 6,
                "arrivals": {"kind": "poisson", "rate": 200.0},
                "prompt": {"kind": "lognormal", "median": 8, "sigma": 0.1, "max": 16},
                "output": {"kind": "lognormal", "median": 8, "sigma": 0.1, "max": 12},
            }
        )
    )
    return spec


def bench(url: str, workload: Path, out: Path, *options: str, stderr: str = "") -> tuple[dict, list[dict]]:
    """engine bench's summary and records; ``stderr`` is what it must print there (a regular expression)."""
    done = subprocess.run(
        [str(ENGINE), "bench", "--url", url, "--workload", str(workload), "--output", str(out), "-q", *options],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and re.fullmatch(stderr, done.stderr, re.S), done.stderr
    with open(out / "requests.csv") as f:
        return json.loads((out / "summary.json").read_text()), list(csv.DictReader(f))


def test_made_up_token_counts_and_finish_reasons_fail_their_requests_and_reach_no_figure(liar, workload, tmp_path):
    # negative, beyond any float, more than asked for, not a number; two honest requests; and "abort" on one
    Liar.counts = itertools.cycle([-5, 10**400, None, 10**6, "seven", None])
    Liar.reasons = itertools.cycle(["length", "length", "length", "length", "length", "abort"])
    summary, rows = bench(f"{liar}/v1", workload, tmp_path / "out")
    assert summary["finished"] == 1 and summary["output_tokens"] >= 1
    assert summary["throughput_tokens_per_s"] > 0 and summary["requests_per_s"] > 0
    failed = [r["detail"] for r in rows if r["status"] == "FINISHED_ABORTED"]
    assert len(failed) == 5, rows
    assert sum("completion tokens for a request of at most" in d for d in failed) == 4, failed
    assert sum("finish reason 'abort'" in d for d in failed) == 1, failed
    assert all(int(r["output_tokens"]) >= 0 for r in rows)


def test_the_server_may_be_given_by_its_root_as_vllm_bench_serve_takes_it(liar, workload, tmp_path):
    Liar.counts, Liar.reasons = itertools.cycle([None]), itertools.cycle(["length"])
    summary, rows = bench(liar, workload, tmp_path / "root")  # no /v1: the liar answers 404 outside it
    assert summary["finished"] == 6 and summary["server"]["url"] == liar
    assert all(r["status"] == "FINISHED_LENGTH_CAPPED" for r in rows)


def test_a_sessions_workloads_ids_reach_the_server_within_a_vocabulary_and_still_share_their_prefixes(liar, tmp_path):
    """A sessions workload's answer and user ids start at 2**40, which no model's vocabulary holds (vLLM
    refuses them): engine bench folds them into ordinary ids, equal ids alike, so each turn's prompt
    still extends the last and sessions on one system prompt still share it, as the workload records."""
    from kvsched.experiments.bench import VOCAB_SPAN, VOCAB_START, prompt_of
    from kvsched.workloads.sessions import SessionSpec

    spec = {
        "kind": "sessions",
        "num_sessions": 4,
        "rate": 50.0,
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": 0.01,
        "system_prompts": 2,
        "system_len": 24,
        "user": {"kind": "fixed", "value": 8},
        "output": {"kind": "fixed", "value": 4},
        "slo_classes": {"interactive": 1, "batch": 1},
    }
    (tmp_path / "sessions.json").write_text(json.dumps(spec))
    Liar.counts, Liar.reasons, Liar.prompts = itertools.cycle([None]), itertools.cycle(["length"]), []
    summary, _ = bench(liar, tmp_path / "sessions.json", tmp_path / "out")
    assert summary["finished"] == 12
    # measured per class, as a simulation is (metrics/classes.py)
    assert (
        sum(c["requests"] for c in summary["classes"]["slo_class"].values()) == 12
        and summary["classes"]["session"]["sessions"] == 4
    )
    assert max(t for p in Liar.prompts for t in p) >= VOCAB_START and all(
        t < VOCAB_START + VOCAB_SPAN for p in Liar.prompts for t in p
    )
    workload = SessionSpec(**spec).requests()
    assert max(t for r in workload for t in r.prompt_token_ids) >= 1 << 40  # what would have been sent
    pairs = [(a, b) for a in workload for b in workload if a is not b]
    extends = {
        (a.request_id, b.request_id) for a, b in pairs if b.prompt_token_ids[: a.prompt_len] == a.prompt_token_ids
    }
    sent = {r.request_id: tuple(prompt_of(r)) for r in workload}
    assert sorted(Liar.prompts) == sorted(sent.values())
    assert len(extends) == 4 * 3  # each session's three turns
    assert {
        (a.request_id, b.request_id) for a, b in pairs if sent[b.request_id][: a.prompt_len] == sent[a.request_id]
    } == extends
    system = {r.prompt_token_ids[:24] for r in workload}
    assert len(system) == len({p[:24] for p in Liar.prompts}) == 2  # the two system prompts, shared, stay two


def test_ids_no_server_takes_are_folded_into_the_span_equal_ids_alike():
    from kvsched.core.request import Request
    from kvsched.experiments.bench import VOCAB_SPAN, VOCAB_START, prompt_of

    sent = prompt_of(Request(request_id="x", prompt_token_ids=(-1, 2**63 - 1, 5, -1, 31000)))
    assert (
        sent[2] == 5
        and sent[0] == sent[3]
        and all(VOCAB_START <= t < VOCAB_START + VOCAB_SPAN for t in sent[:2] + sent[3:])
    )


def test_a_server_that_sends_headers_and_then_nothing_fails_each_request_after_the_timeout(liar, workload, tmp_path):
    """The client once waited an hour for each such request."""
    Liar.acts = itertools.cycle(["hang", "answer"])
    start = time.monotonic()
    summary, rows = bench(liar, workload, tmp_path / "out", "--timeout", "1")
    assert time.monotonic() - start < 60
    hung = [r["detail"] for r in rows if r["status"] == "FINISHED_ABORTED"]
    assert summary["finished"] == 3 and hung == ["the server sent nothing for 1 s (--timeout)"] * 3, rows


def test_a_request_refused_or_ended_unrun_is_recorded_as_ignored_with_the_servers_reason(liar, workload, tmp_path):
    """vLLM drops every chunk of a request that ends without a token, its finish reason too: such requests were
    recorded as aborted, with "the stream ended with finish reason None"; and nothing said before the replay that
    the workload passes the server's context."""
    from kvsched.workloads import build_workload

    Liar.acts, Liar.context = itertools.cycle(["refuse", "empty", "answer"]), 16
    over = sum(r.prompt_len + r.output_len > 16 for r in build_workload(str(workload)).requests())
    assert 0 < over < 6
    summary, rows = bench(
        liar,
        workload,
        tmp_path / "out",
        stderr=rf"warning: {over} of 6 requests need more than the "
        r"server's context of 16 tokens \(prompt \+ output; req-\d+: \d+ \+ \d+\): "
        r"the server will refuse them\n",
    )
    assert summary["finished"] == 2 and summary["ignored"] == 4 and summary["aborted"] == 0
    refused = [r["detail"] for r in rows if r["status"] == "FINISHED_IGNORED" and "HTTP" in r["detail"]]
    assert refused == ["refused by the server (HTTP 400): This model's maximum context length is 32 tokens"] * 2
    unrun = [r for r in rows if r["status"] == "FINISHED_IGNORED" and "HTTP" not in r["detail"]]
    assert len(unrun) == 2 and all(
        r["detail"].startswith("the server ended it without a token or a finish reason") for r in unrun
    )
    assert all(r["finish_reason"] == "length" and r["output_tokens"] == "0" and r["finish_time"] for r in unrun)
    assert any(w["reason"].startswith("ignored: refused by the server (HTTP 400)") for w in summary["warnings"])


@pytest.mark.parametrize("label", ["\x1b[31mred\x1b[0m", "two\nlines", "\r", "   "])
def test_a_label_that_is_not_one_printable_line_is_refused_before_the_replay(liar, workload, tmp_path, label):
    """A label with ANSI escapes or line breaks was once written as it was into the summary, the terminal, the board."""
    for command in (
        ["bench", "--url", liar, "--workload", str(workload)],
        ["leaderboard", "-p", "fcfs", "-w", str(workload), "--seeds", "1", "--real", liar],
    ):
        done = subprocess.run(
            [str(ENGINE), *command, "--label", label, "-q", "-o", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "--label must be printable text" in done.stderr
        assert "\x1b" not in done.stderr and not (tmp_path / "out").exists() and not Liar.prompts

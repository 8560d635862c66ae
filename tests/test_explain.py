"""``engine explain`` end to end, through the console script, on a run whose every wait is known.

Three requests, one-second steps, blocks of four tokens, five GPU blocks, no watermark:
  req-0 (8 prompt tokens, 6 out) and req-1 (8, 4) are admitted together in step 0 (2 blocks each);
  step 1: both need a third block, one is free: req-1, the newest, is preempted (recompute) for itself;
  steps 2–5: req-1 (9 tokens now: 3 blocks) waits for blocks (2 free); req-2 (4, 1), which arrived at
  1.5 s, waits behind it; req-0 ends in step 5, and both are admitted in step 6.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
UNIT = (
    '{"name":"unit","base_ms":1000,"prefill_token_ms":0,"decode_seq_ms":0,"kv_token_ms":0,'
    '"kv_bytes_per_token":0,"swap_gb_per_s":1e9,"copy_gb_per_s":1e9}'
)


def engine(*args):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explain")
    (tmp / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,8,6\n0,8,4\n1.5,4,1\n")
    (tmp / "unit.json").write_text(UNIT)
    proc = engine(
        "run",
        "-q",
        "--trace",
        tmp / "t.csv",
        "--profile",
        tmp / "unit.json",
        "--set",
        "block_size=4",
        "--set",
        "num_gpu_blocks=5",
        "--set",
        "watermark=0",
        "--output",
        tmp / "out",
    )
    assert proc.returncode == 0, proc.stderr
    return tmp / "out"


def lines(proc):
    assert proc.returncode == 0, proc.stderr
    return [" ".join(line.split()) for line in proc.stdout.splitlines()]


def test_a_preempted_request_timeline(run_dir):
    out = lines(engine("explain", run_dir, "--request", "req-1"))
    assert "1.000 – 6.000 s steps 1–5 preempted (recompute, for req-1)" in out
    assert "step 1 1.000 s preempted (recompute): back to the waiting queue" in out
    i = out.index("steps 2–5 4.000 s not enough free KV blocks (LATER)")
    assert out[i + 1] == "needed 3 blocks, 2 free (0 stay free: the watermark)"
    assert "admitted at step 6: 9 tokens" in out  # the prompt and its one generated token, recomputed
    assert (
        out[-1]
        == "waited 5.000 s in all: 80.0% not enough free KV blocks (LATER); 20.0% preempted (recompute): back to the "
        "waiting queue"
    )


def test_a_request_that_waited_behind_another(run_dir):
    out = lines(engine("explain", run_dir, "--request", "req-2"))
    assert "1.500 – 6.000 s steps 2–5 queued" in out
    assert "0.500 s arrived while a step ran (waits for the next one)" in out
    i = out.index("steps 2–5 4.000 s head-of-line: behind a request that lacked free KV blocks")
    assert out[i + 1 : i + 3] == ["needed 3 blocks, 2 free (0 stay free: the watermark)", "stopped at 1 request: req-1"]


def test_one_step_its_batch_and_who_was_left_out(run_dir):
    out = lines(engine("explain", run_dir, "--step", "3"))
    assert out[1] == "as it began: 2 waiting · 1 running · 0 swapped · after it: 3 of 5 GPU KV blocks used"
    assert "decoded req-0" in out
    assert (
        "req-1 (waiting): not enough free KV blocks (LATER): needed 3 blocks, 2 free (0 stay free: the watermark)"
        in out
    )
    assert (
        "waiting: 1 more not offered: head-of-line: behind a request that lacked free KV blocks (stopped at req-1)"
        in out
    )
    step1 = lines(engine("explain", run_dir, "--step", "1"))
    assert "preempted req-1 (recompute) to make room for req-1" in step1


def test_the_run_weighted_by_time(run_dir):
    out = lines(engine("explain", run_dir))
    assert "waiting for admission: 8.5 request·s" in out
    assert "47.1% 4.0 request·s not enough free KV blocks (LATER)" in out
    assert "47.1% 4.0 request·s head-of-line: behind a request that lacked free KV blocks" in out
    assert "5.9% 0.5 request·s arrived while a step ran (waits for the next one)" in out
    assert "100.0% 1.0 request·s preempted (recompute): back to the waiting queue" in out
    assert out[-1] == "req-2: 4.5 s"


@pytest.mark.parametrize(
    "args, message",
    [
        (("--request", "nope"), "no request 'nope'"),
        (("--step", "99"), "step 99 is not in this run"),
        (("--step", "1", "--request", "req-1"), "not both"),
    ],
)
def test_bad_questions_are_one_line(run_dir, args, message):
    proc = engine("explain", run_dir, *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_folder_without_a_log_is_one_line(tmp_path):
    proc = engine("explain", tmp_path)
    assert proc.returncode == 2 and "decisions.parquet" in proc.stderr and "Traceback" not in proc.stderr


def test_a_long_timeline_is_shortened_unless_full_and_a_victim_says_why(tmp_path):
    """explain --request printed 1,006 lines for one request; a policy could not say why it chose its victim."""
    engine = str(Path(sys.executable).parent / "engine")
    out = tmp_path / "run"
    done = subprocess.run(
        [engine, "run", "-p", "lcf", "-w", "sharegpt-4k", "--rate", "3", "-n", "200", "-o", out, "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    import pandas as pd

    rows = pd.read_csv(out / "requests.csv")
    victim = rows.sort_values(["preemptions_recompute", "request_id"]).request_id.iloc[-1]
    short = subprocess.run(
        [engine, "explain", out, "--request", victim], capture_output=True, text=True
    ).stdout.splitlines()
    full = subprocess.run(
        [engine, "explain", out, "--request", victim, "--full"], capture_output=True, text=True
    ).stdout.splitlines()
    assert (
        len(short) <= 45 < len(full)
        and short[-1].startswith("(shortened from")
        and "--full shows every one" in short[-1]
    )
    assert any("the policy's reason: lcf victim:" in line for line in full) and short[:2] == full[:2]
    events = pd.read_parquet(out / "decisions.parquet")
    step = int(events[(events.event == "preempted") & (events.request_id == victim)].step.iloc[0])
    assert any(
        f"preempted  {victim} (recompute) to make room for" in line and ": lcf victim:" in line
        for line in subprocess.run(
            [engine, "explain", out, "--step", str(step)], capture_output=True, text=True
        ).stdout.splitlines()
    )
    refused = subprocess.run([engine, "explain", out, "--full"], capture_output=True, text=True)
    assert refused.returncode == 2 and "give it with --request" in refused.stderr


def test_a_preemption_reason_must_be_a_line_of_text():
    from helpers import req, unit_engine

    from kvsched import Preemption, PreemptionMode, hookimpl
    from kvsched.errors import PolicyError
    from kvsched.policies.vllm_v1 import VllmV1

    class Mumbles(VllmV1):
        @hookimpl
        def choose_preemption(self, step, requester):
            return Preemption(requester, PreemptionMode.RECOMPUTE, reason=42)

    eng = unit_engine(Mumbles(), num_gpu_blocks=4, block_size=4)
    for i in range(3):
        eng.add_request(req(f"r{i}", 6, 8))
    with pytest.raises(PolicyError, match="a Preemption's reason is a line of text"):
        eng.run()
    eng.check()  # the refused step was rolled back: every block accounted for


def test_a_request_fanned_out_under_v1_is_explained_child_by_child(tmp_path):
    """vLLM V1's mechanics run a request with ``n > 1`` as ``n`` child requests ``{i}_{id}``, which the decision
    log names: explain, the file check and the trace take them as the parent's (explain used to refuse the folder)."""
    import json

    import pandas as pd

    out_dir, trace = tmp_path / "v1", tmp_path / "trace.json"
    proc = engine(
        "run",
        "-q",
        "--policy",
        "vllm-v1",
        "-n",
        "40",
        "--seed",
        "1",
        "--decision-log",
        "--trace-out",
        trace,
        "--output",
        out_dir,
    )
    assert proc.returncode == 0, proc.stderr
    requests = pd.read_parquet(out_dir / "requests.parquet")
    parent = requests[requests.n > 1].iloc[0]
    rid, n = parent.request_id, int(parent.n)
    out = lines(engine("explain", out_dir, "--request", rid, "--full"))
    assert out[0].startswith(f"{rid} · prompt")
    for i in range(n):
        assert any(line.endswith(f"prefill [{i}_{rid}]") for line in out), i
    child = lines(engine("explain", out_dir, "--request", f"1_{rid}"))
    assert child[0].startswith(f"1_{rid} (one of the {n} requests {rid} fanned out into) · prompt")
    assert not any("[" in line for line in child)
    bad = engine("explain", out_dir, "--request", f"{n}_{rid}")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and f"{n}_{rid}" in bad.stderr
    log = pd.read_parquet(out_dir / "decisions.parquet")
    for _, r in requests[requests.n > 1].iterrows():  # the log forgot no child once its parent finished
        ended = log[(log.event == "finished") & (log.request_id == r.request_id)].step.max()
        children = log[log.request_id.isin([f"{i}_{r.request_id}" for i in range(int(r.n))])]
        assert children.step.max() <= ended, r.request_id
    names = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "thread_name"}
    assert {f"{i}_{rid}" for i in range(n)} <= names and rid not in names

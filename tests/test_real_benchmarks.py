"""The real-engine benchmarks' bookkeeping, without a model: ours against vLLM alternates and checks the
work is the same, and a failed vLLM run says why."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import real_throughput
    import vllm_integration

    return real_throughput, vllm_integration


def test_vllm_rounds_alternate_which_side_goes_first_and_report_each_rounds_ratio(scripts, monkeypatch, capsys):
    real_throughput, vllm_integration = scripts
    calls, vllm_speeds, our_seconds = [], iter([200.0, 250.0, 100.0]), iter([50.0, 20.0])
    monkeypatch.setattr(
        vllm_integration,
        "run_side",
        lambda side: (
            calls.append("vllm") or {"tokens": 1000, "prompt_tokens": 300, "seconds": 1000 / next(vllm_speeds)}
        ),
    )
    monkeypatch.setattr(real_throughput, "run_ours", lambda *a: calls.append("ours") or (None, next(our_seconds), 1000))
    monkeypatch.setattr(real_throughput, "requests_for", lambda *a, **k: [])
    figures = {"ours_tok_s": 100.0, "output_tokens": 1000, "prompt_tokens": 300, "prefix_caching_tok_s": 150.0}
    out = real_throughput.vllm_rounds(None, [], [], None, figures, 3)
    assert calls == ["vllm", "vllm", "ours", "ours", "vllm"]  # round 1's ours is the run already in figures
    assert out["ours_tok_s_rounds"] == [100.0, 20.0, 50.0] and out["vllm_tok_s_rounds"] == [200.0, 250.0, 100.0]
    assert out["ours_vs_vllm_rounds"] == pytest.approx([0.5, 0.08, 0.5])
    assert "range 0.080-0.500 over 3 alternating rounds" in capsys.readouterr().out


def test_vllm_rounds_refuse_a_vllm_run_that_did_other_work(scripts, monkeypatch):
    real_throughput, vllm_integration = scripts
    monkeypatch.setattr(
        vllm_integration, "run_side", lambda side: {"tokens": 1000, "prompt_tokens": 299, "seconds": 5.0}
    )
    figures = {"ours_tok_s": 100.0, "output_tokens": 1000, "prompt_tokens": 300, "prefix_caching_tok_s": 150.0}
    with pytest.raises(AssertionError, match="other work"):
        real_throughput.vllm_rounds(None, [], [], None, figures, 1)


def test_a_failed_vllm_throughput_run_ends_with_the_tail_of_its_stderr(scripts, monkeypatch):
    _, vllm_integration = scripts
    monkeypatch.setattr(
        vllm_integration.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a[0], 1, stderr="noise\nValueError: no KV cache space"),
    )
    with pytest.raises(SystemExit, match="(?s)vllm throughput run failed.*no KV cache space"):
        vllm_integration.run_side("vllm")


def test_the_case_study_summary_reads_the_kept_rounds_and_gives_each_ratios_range(scripts, tmp_path, capsys):
    _, vllm_integration = scripts
    vip_ttft = {"vllm-fcfs": (10.0, 8.0), "vllm-priority": (2.0, 4.0), "priority-vip": (1.0, 1.0)}
    for name, per_round in vip_ttft.items():
        for r, vip in enumerate(per_round, 1):
            run_dir = tmp_path / f"{name}-{r}"
            run_dir.mkdir()
            rows = [f"{vip},10.0,vip,20"] + ["5.0,10.0,default,20"] * 4 + [",,default,0"]  # one request never started
            (run_dir / "requests.csv").write_text("ttft,e2e,tenant,output_tokens\n" + "\n".join(rows) + "\n")
            (run_dir / "summary.json").write_text('{"throughput_tokens_per_s": 100.0, "finished": 5}')
    vllm_integration.part_case_study(tmp_path, 2, run=False)
    out = capsys.readouterr().out
    assert "round 2 priority-vip  VIP p99 TTFT   1.00 s · others   5.00 s · 100.0 output tok/s · 5 finished" in out
    assert "priority-vip / vllm-fcfs: VIP p99 TTFT 0.113 (0.100-0.125), others' p99 TTFT 1.000 (1.000-1.000)" in out
    assert "priority-vip / vllm-priority: VIP p99 TTFT 0.375 (0.250-0.500)" in out
    assert "vllm-priority / vllm-fcfs: VIP p99 TTFT 0.350 (0.200-0.500)" in out

    for f in (tmp_path / "vllm-fcfs-1").iterdir():  # a round that was not run: the ratios against it use the others
        f.unlink()
    (tmp_path / "vllm-fcfs-1").rmdir()
    vllm_integration.part_case_study(tmp_path, 2, run=False)
    out = capsys.readouterr().out
    assert "round 1 vllm-fcfs     not in" in out
    assert "priority-vip / vllm-fcfs: VIP p99 TTFT 0.125 (0.125-0.125)" in out and "(mean and range of rounds 2)" in out
    assert (
        "priority-vip / vllm-priority: VIP p99 TTFT 0.375 (0.250-0.500)" in out
        and "(mean and range of rounds 1, 2)" in out
    )

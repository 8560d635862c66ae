"""Workloads: synthetic processes and mixes, trace replay windows and scaling, built-ins."""

import json
import statistics

import pytest

from kvsched.workloads import Gamma, Poisson, SyntheticSpec, TraceWorkload, build_workload, builtin_path
from kvsched.workloads.distributions import Empirical, Fixed, LogNormal, Uniform
from kvsched.workloads.embedded import SyntheticWorkload
from kvsched.workloads.errors import WorkloadError


def gaps(reqs):
    t = [r.arrival_time for r in reqs]
    return [b - a for a, b in zip([0.0] + t, t)]


def test_default_workload_is_the_embedded_job_unchanged():
    assert build_workload().requests() == SyntheticWorkload().requests()
    assert build_workload(num_requests=7, seed=3).requests() == SyntheticWorkload(num_requests=7, seed=3).requests()


def test_poisson_and_gamma_rates_and_burstiness():
    poisson = SyntheticSpec(num_requests=20000, arrivals=Poisson(rate=10)).requests()
    bursty = SyntheticSpec(num_requests=20000, arrivals=Gamma(rate=10, cv=4)).requests()
    for reqs, cv in ((poisson, 1.0), (bursty, 4.0)):
        g = gaps(reqs)
        mean = statistics.fmean(g)
        assert mean == pytest.approx(0.1, rel=0.1)
        assert statistics.pstdev(g) / mean == pytest.approx(cv, rel=0.15)


def test_length_distributions_and_mixes():
    spec = SyntheticSpec(
        num_requests=4000,
        prompt=Uniform(low=10, high=20),
        output=Fixed(value=7),
        priorities={0: 1, 5: 3},
        tenants={"a": 1, "b": 1},
        n={1: 1, 3: 1},
        seed=1,
    )
    reqs = spec.requests()
    assert {r.prompt_len for r in reqs} == set(range(10, 21))
    assert {r.output_len for r in reqs} == {7}
    assert sum(r.priority == 5 for r in reqs) / len(reqs) == pytest.approx(0.75, abs=0.03)
    assert {r.tenant for r in reqs} == {"a", "b"} and {r.sampling.n for r in reqs} == {1, 3}
    assert spec.requests() == reqs  # same spec and seed: same requests
    emp = SyntheticSpec(
        num_requests=500, prompt=Empirical(values=(3, 99)), output=LogNormal(median=50, sigma=1, max=60)
    ).requests()
    assert {r.prompt_len for r in emp} == {3, 99} and max(r.output_len for r in emp) == 60


@pytest.fixture
def azure(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.5000000,100,10\n"
        "2023-11-16 18:15:47.0000000,200,20\n"
        "2023-11-16 18:15:49.5000000,300,30\n"
        "2023-11-16 18:16:46.5,400,40\n"
    )
    return p


def test_azure_replay_times_scale_offset_and_cap(azure):
    reqs = TraceWorkload(path=azure).requests()
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 3.0, 60.0]
    assert [(r.prompt_len, r.output_len, r.sampling.max_tokens) for r in reqs][1] == (
        200,
        20,
        40,
    )  # the cap: the longest answer
    fast = TraceWorkload(path=azure, rate_scale=2).requests()
    assert [r.arrival_time for r in fast] == [0.0, 0.25, 1.5, 30.0]
    window = TraceWorkload(path=azure, start_offset=0.5, max_requests=2).requests()
    assert [(r.arrival_time, r.prompt_len) for r in window] == [(0.0, 200), (2.5, 300)]


def test_prefill_cut_keeps_outputs_and_shortens_prompts_as_vidur_does(tmp_path):
    p = tmp_path / "plain.csv"
    p.write_text("arrival_time_s,prompt_tokens,output_tokens\n0.0,100,20\n1.0,90,20\n2.0,5,100\n")
    cut = TraceWorkload(path=p, max_total_tokens=110)
    assert [(r.prompt_len, r.output_len) for r in cut.requests()] == [(90, 20), (90, 20), (5, 100)]
    assert cut.num_cut() == 1 and TraceWorkload(path=p).num_cut() == 0
    with pytest.raises(WorkloadError, match="request 2: its 100 output tokens alone reach max_total_tokens 100"):
        TraceWorkload(path=p, max_total_tokens=100).requests()
    with pytest.raises(WorkloadError, match="traces only"):
        build_workload("synthetic", max_total_tokens=100)


def test_azure_conv_under_vidurs_cut(tmp_path):
    """The like-Vidur replay: 4,096 tokens at most, as Vidur's trace replay gives it (1,612 prompts cut)."""
    workload = build_workload("azure-conv", max_total_tokens=4096)
    reqs = workload.requests()
    full = build_workload("azure-conv").requests()
    assert len(reqs) == len(full) == workload.num_requests == 19_366
    assert max(r.prompt_len + r.output_len for r in reqs) == 4096
    assert workload.num_cut() == sum(a.prompt_len != b.prompt_len for a, b in zip(reqs, full)) == 1_612
    assert [r.output_len for r in reqs] == [r.output_len for r in full]


def test_workloads_stream_the_same_requests_they_list():
    for workload in (
        build_workload(num_requests=50),
        build_workload("synthetic", num_requests=50),
        build_workload("azure-conv", num_requests=50),
    ):
        stream = workload.iter_requests()
        assert not isinstance(stream, list)
        assert list(stream) == workload.requests() and workload.num_requests == 50


def test_rate_changes_the_rate_of_the_job_it_is_given_and_nothing_else(tmp_path):
    """``--rate`` on the embedded job is that job faster or slower (400 requests, n > 1 mix), not another workload."""
    faster = build_workload(rate=16.0)
    assert faster.describe() == {**SyntheticWorkload(rate=16.0).model_dump(), "kind": "default"}
    assert faster.requests() == SyntheticWorkload(rate=16.0).requests()
    assert build_workload(rate=16.0, rate_scale=0.5).requests() == SyntheticWorkload(rate=8.0).requests()
    assert len(build_workload("synthetic", rate=16.0).requests()) == 1000  # the synthetic workload keeps its own size
    with pytest.raises(WorkloadError, match="embedded default job has Poisson arrivals"):
        build_workload(arrival="gamma", cv=2.0)
    with pytest.raises(WorkloadError, match="--cv is the burstiness of gamma arrivals"):
        build_workload("synthetic", cv=2.0)
    spec = tmp_path / "s.json"
    spec.write_text('{"kind": "synthetic", "num_requests": 5}')
    with pytest.raises(WorkloadError, match="sets its own arrivals"):
        build_workload(str(spec), rate=3.0)


def test_plain_format_with_priority_and_tenant(tmp_path):
    p = tmp_path / "plain.csv"
    p.write_text("arrival_time_s,prompt_tokens,output_tokens,priority,tenant\n0.0,5,2,1,alice\n1.5,6,3,0,bob\n")
    reqs = TraceWorkload(path=p).requests()
    assert [(r.arrival_time, r.prompt_len, r.output_len, r.priority, r.tenant) for r in reqs] == [
        (0.0, 5, 2, 1, "alice"),
        (1.5, 6, 3, 0, "bob"),
    ]


def test_length_only_file_gets_synthetic_arrivals(tmp_path):
    p = tmp_path / "lengths.csv"
    p.write_text(
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
        + "".join(f"{i},{i + 1},{2 * i + 1},1.0\n" for i in range(1, 2001))
    )
    reqs = build_workload(trace=p, rate=50.0).requests()
    assert len(reqs) == 2000 and {(r.prompt_len, r.output_len - r.prompt_len) for r in reqs} == {(1, 1)} | {
        (i, 1) for i in range(2, 2001)
    }
    assert reqs[-1].arrival_time / 2000 == pytest.approx(1 / 50, rel=0.1)
    assert len(build_workload(trace=p, num_requests=10).requests()) == 10


def test_builtin_workloads_ship_in_the_package():
    assert builtin_path("azure-conv").is_file() and builtin_path("sharegpt").is_file()
    assert (builtin_path("azure-conv").parent / "README.md").read_text().count("CC-BY 4.0") >= 1
    conv = build_workload("azure-conv").requests()
    assert len(conv) == 19366 and conv[-1].arrival_time == pytest.approx(3501.72, abs=0.01)
    share = build_workload("sharegpt", num_requests=100, rate=2.0).requests()
    assert len(share) == 100 and max(r.prompt_len for r in share) <= 8192


def test_documented_json_spec_loads(tmp_path):
    from pathlib import Path

    spec = build_workload(
        str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "bursty-tenants.json"), num_requests=300
    )
    reqs = spec.requests()
    assert len(reqs) == 300 and {r.tenant for r in reqs} == {"free", "pro", "batch"}
    trace_spec = tmp_path / "t.json"
    (tmp_path / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,5,2\n2,6,3\n")
    trace_spec.write_text('{"kind": "trace", "path": "t.csv", "rate_scale": 2}')
    assert [r.arrival_time for r in build_workload(str(trace_spec)).requests()] == [0.0, 1.0]


def test_builtin_data_is_declared_as_package_data():
    """A wheel or regular install carries the traces only if pyproject says so."""
    import fnmatch
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "kvsched.workloads.data"
    ]
    for f in (root / "workloads" / "data").iterdir():
        assert any(fnmatch.fnmatch(f.name, p) for p in patterns), f.name


def test_spreadsheet_export_with_bom_and_crlf(tmp_path):
    p = tmp_path / "excel.csv"
    p.write_bytes("\ufeffarrival_time_s,prompt_tokens,output_tokens\r\n0,5,2\r\n1.5,6,3\r\n".encode("utf-8"))
    assert [(r.arrival_time, r.prompt_len) for r in TraceWorkload(path=p).requests()] == [(0.0, 5), (1.5, 6)]


def test_a_sessions_turns_carry_their_sessions_id_for_session_aware_policies():
    from kvsched.workloads.sessions import SessionSpec

    requests = SessionSpec(num_sessions=5, seed=3).requests()
    by_session: dict[str, list] = {}
    for r in requests:
        by_session.setdefault(r.session_id, []).append(r)
    assert len(by_session) == 5
    for sid, turns in by_session.items():
        assert {t.request_id.split("-")[0] for t in turns} == {sid}  # s3-t0, s3-t1, ... all s3
        assert all(b.prompt_token_ids[: a.prompt_len] == a.prompt_token_ids for a, b in zip(turns, turns[1:]))


def test_slo_class_mixes_label_requests_and_sessions_and_leave_unlabelled_workloads_unchanged():
    from collections import Counter

    from kvsched.workloads.sessions import SessionSpec

    plain = SyntheticSpec(num_requests=300, seed=4).requests()
    tiered = SyntheticSpec(num_requests=300, seed=4, slo_classes={"interactive": 1, "batch": 3}).requests()
    assert {r.slo_class for r in plain} == {None}
    counts = Counter(r.slo_class for r in tiered)
    assert set(counts) == {"interactive", "batch"} and 45 <= counts["interactive"] <= 105  # a quarter of 300
    one = SyntheticSpec(
        num_requests=300, seed=4, slo_classes={"batch": 1}
    ).requests()  # no choice, no draw: same lengths
    assert [r.slo_class for r in one] == ["batch"] * 300
    assert [(r.prompt_len, r.arrival_time) for r in one] == [(r.prompt_len, r.arrival_time) for r in plain]
    turns = SessionSpec(num_sessions=40, seed=1, slo_classes={"interactive": 1, "background": 1}).requests()
    by_session = {}
    for r in turns:
        by_session.setdefault(r.session_id, set()).add(r.slo_class)
    assert all(len(classes) == 1 for classes in by_session.values())  # a session keeps its class
    assert set().union(*by_session.values()) == {"interactive", "background"}
    assert {r.slo_class for r in SessionSpec(num_sessions=5).requests()} == {None}
    with pytest.raises(ValueError, match="at least one entry"):
        SyntheticSpec(slo_classes={})
    with pytest.raises(ValueError, match="weights must be >= 0"):
        SessionSpec(slo_classes={"interactive": -1})


@pytest.mark.parametrize("mix", ["tenants", "priorities", "slo_classes"])
def test_mix_weights_whose_sum_overflows_are_refused_as_they_load(mix):
    # each weight is finite, but together they sum to inf, and a draw would land past the table's end
    keys = {"priorities": (0, 1)}.get(mix, ("a", "b"))
    with pytest.raises(ValueError, match="positive, finite sum"):
        SyntheticSpec(num_requests=5, **{mix: dict.fromkeys(keys, 1e308)})


def test_a_request_is_sent_with_a_cap_not_with_its_answer_s_length(azure):
    """Every workload sent max_tokens = the true output, so a policy reading the cap knew the future (issue 32)."""
    from kvsched.workloads.sessions import SessionSpec

    plain = SyntheticSpec(num_requests=300, seed=4).requests()
    assert {r.sampling.max_tokens for r in plain} == {
        480
    }  # the output distribution's maximum: the same for every request
    assert len({r.output_len for r in plain}) > 100
    exact = SyntheticSpec(num_requests=300, seed=4, cap={"kind": "exact"}).requests()
    assert all(r.sampling.max_tokens == r.output_len for r in exact)  # the oracle cap, only when asked for
    assert [(r.prompt_len, r.arrival_time, r.output_len) for r in exact] == [
        (r.prompt_len, r.arrival_time, r.output_len) for r in plain
    ]
    drawn = SyntheticSpec(num_requests=300, seed=4, cap={"kind": "drawn", "caps": {"64": 1, "1024": 1}}).requests()
    assert {r.sampling.max_tokens for r in drawn} == {64, 1024} and all(
        r.output_len <= r.sampling.max_tokens for r in drawn
    )
    cut = [(p.output_len, d.output_len) for p, d in zip(plain, drawn) if d.sampling.max_tokens == 64]
    assert all(d == min(o, 64) for o, d in cut) and any(o > 64 for o, _ in cut)  # an answer past its cap ends there
    assert [r.prompt_len for r in drawn] == [r.prompt_len for r in plain]  # the caps draw from a stream of their own
    assert {r.sampling.max_tokens for r in TraceWorkload(path=azure).requests()} == {40}  # the trace's longest answer
    assert [r.output_len for r in TraceWorkload(path=azure, cap={"kind": "fixed", "tokens": 25}).requests()] == [
        10,
        20,
        25,
        25,
    ]
    sessions = SessionSpec(num_sessions=5).requests()
    assert {r.sampling.max_tokens for r in sessions} == {512} and SessionSpec().describe()["cap"] == {
        "kind": "fixed",
        "tokens": None,
    }


def test_a_bad_cap_model_is_refused_by_name(tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"kind": "synthetic", "cap": {"kind": "drawn", "caps": {"0": 1}}}))
    with pytest.raises(WorkloadError, match="cap.drawn.caps"):
        build_workload(str(spec))
    spec.write_text(json.dumps({"kind": "synthetic", "cap": {"kind": "psychic"}}))
    with pytest.raises(WorkloadError, match="cap"):
        build_workload(str(spec))

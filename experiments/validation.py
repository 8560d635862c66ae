"""``engine validate``: simulate a real run recorded in an inference-perf result folder and compare.

A folder holds what the run did (the layout of the BLIS team's published H100 runs):
``exp-config.yaml`` (the vLLM server's settings: model, tensor parallelism, ``max_model_len``,
``max_num_batched_tokens``, ``max_num_seqs``, and any of ``gpu_memory_utilization``, ``block_size``,
``num_gpu_blocks``, ``enable_prefix_caching``, ``enable_chunked_prefill``, ``dtype``),
``results/config.yaml`` (the inference-perf config as inference-perf read it; else ``profile.yaml``,
as it was written) and ``results/stage_N_lifecycle_metrics.json`` (what the client measured).

The run is simulated with ``vllm-v1`` (vLLM V1's scheduler: chunked prefill, prefix caching and
async scheduling on, as vLLM ≥ 0.14 runs by default) on the roofline profile of the model on the
named GPU, through inference-perf's client (``workloads/client_loop.py``). Two things the folder
records are taken as facts of the run, because no simulator can know them: the prompt tokens the
server counted (inference-perf's random text re-tokenises into a few more tokens than it asked
for: each question gets the mean difference), and the output tokens the client counted for
``normalized_time_per_output_token`` (a base model's text after its end-of-sequence token
re-tokenises into fewer tokens than it generated: each simulated request draws a count from the
stage's recorded distribution, whose lowest counts, which set the mean time per token, are pinned by the
recorded mean time per token: ``stretch_tail``). Then each stage's E2E latency, TTFT and ITL (inference-perf's
``normalized_time_per_output_token``) mean, p90 and p99 are compared.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.core.config import EngineConfig
from kvsched.executors.model_config import HF_IDS
from kvsched.executors.profiles import roofline_profile
from kvsched.experiments.simulation import SimJob
from kvsched.metrics.lifecycle import PERCENTILES, read_lifecycle, run_reports
from kvsched.userfiles.reader import FileError, read_text
from kvsched.workloads.inference_perf import InferencePerfWorkload, load_inference_perf

METRICS = (("e2e", "request_latency"), ("ttft", "time_to_first_token"), ("itl", "normalized_time_per_output_token"))
STATS = ("mean", "p90", "p99")
SERVER_KEYS = {  # exp-config.yaml's names (and vLLM's own) of the engine settings a run records
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs",
    "block_size": "block_size",
    "num_gpu_blocks": "num_gpu_blocks",
    "num_gpu_blocks_override": "num_gpu_blocks",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
}


@dataclass
class Experiment:
    """One result folder, read."""

    path: Path
    name: str
    model: str  # the server's model (a Hugging Face id)
    tp: int
    server: dict[str, Any]
    client: Path  # the inference-perf config that ran
    recorded: dict[str, dict]  # report file name: its content

    @property
    def stages(self) -> list[str]:
        return sorted((n for n in self.recorded if n.startswith("stage_")), key=lambda n: int(n.split("_")[1]))


@dataclass
class Validation:
    """An experiment simulated: each stage's recorded and simulated metrics, and the time it took."""

    experiment: Experiment
    simulated: dict[str, dict]
    simulate_s: float
    num_requests: int
    profile: Any = field(repr=False, default=None)
    records: list = field(repr=False, default_factory=list)  # the engine's (RequestMetrics)

    def rows(self) -> list[dict[str, Any]]:
        """One row per stage and metric: recorded and simulated mean, p90, p99, and the relative errors."""
        out = []
        for stage in self.experiment.stages:
            real, sim = self.experiment.recorded[stage]["successes"], self.simulated[stage]["successes"]
            for metric, key in METRICS:
                row = {"experiment": self.experiment.name, "stage": int(stage.split("_")[1]), "metric": metric}
                for stat in STATS:
                    r, s = real["latency"][key][stat], (sim["latency"][key] or {}).get(stat, float("nan"))
                    row[f"real_{stat}"], row[f"sim_{stat}"] = r, s
                    row[f"err_{stat}"] = (s - r) / r if r else float("nan")
                row["real_ok"], row["sim_ok"] = real["count"], sim["count"]
                out.append(row)
        return out


def read_experiment(path: Path) -> Experiment:
    """A result folder, checked: each file it needs present and readable, errors naming file and field."""
    import yaml

    path = Path(path)
    config = path / "exp-config.yaml"
    try:
        server = yaml.safe_load(read_text(config, "vLLM settings"))
    except yaml.YAMLError as exc:
        raise FileError(f"not valid YAML: {exc}", config) from None
    if not isinstance(server, dict):
        raise FileError("expected the vLLM server's settings (model, tensor_parallelism, ...)", config)
    for key in ("model",):
        if not isinstance(server.get(key), str):
            raise FileError(f"field {key!r}: missing (the model the server ran)", config)
    tp = server.get("tensor_parallelism", server.get("tensor_parallel_size", 1))
    if type(tp) is not int or tp < 1:
        raise FileError(f"field 'tensor_parallelism': must be a positive integer, got {tp!r}", config)
    client = path / "results" / "config.yaml"
    if not client.exists():
        client = path / "profile.yaml"
    recorded = {p.name: read_lifecycle(p) for p in sorted((path / "results").glob("*_lifecycle_metrics.json"))}
    if not any(n.startswith("stage_") for n in recorded):
        raise FileError("no results/stage_N_lifecycle_metrics.json: nothing to compare with", path)
    return Experiment(path, path.name, server["model"], tp, server, client, recorded)


def engine_config(experiment: Experiment, overrides: dict[str, Any] | None = None) -> EngineConfig:
    """vLLM V1's defaults (prefix caching, chunked prefill, async scheduling) with the settings the run records."""
    fields: dict[str, Any] = {"enable_prefix_caching": True, "async_scheduling": True}
    for key, name in SERVER_KEYS.items():
        if key in experiment.server:
            fields[name] = experiment.server[key]
    return EngineConfig.model_validate({**fields, **(overrides or {})})


def experiment_profile(experiment: Experiment, hardware, model_config=None, config: EngineConfig | None = None):
    """The roofline profile of the run's model (``model_config``, else the shipped config its id names) on a GPU."""
    config = config or engine_config(experiment)
    model = model_config or HF_IDS.get(experiment.model.lower())
    if model is None:
        raise FileError(
            f"field 'model': no shipped config for {experiment.model!r}: give --model-config",
            experiment.path / "exp-config.yaml",
        )
    return roofline_profile(
        hardware,
        model,
        experiment.tp,
        experiment.server.get("dtype"),
        gpu_memory_utilization=experiment.server.get("gpu_memory_utilization", 0.9),
        max_num_batched_tokens=config.max_num_batched_tokens,
    )


def experiment_workload(experiment: Experiment, seed: int = 0, scale: float = 1.0) -> InferencePerfWorkload:
    """The run's requests, each question lengthened by the tokens the server counted beyond what was asked
    (``scale``: each stage cut to that share of its duration)."""
    nominal = load_inference_perf(experiment.client, seed, duration_scale=scale)
    counted = experiment.recorded.get("summary_lifecycle_metrics.json") or experiment.recorded[experiment.stages[0]]
    prompt = (counted["successes"].get("prompt_len") or {}).get("mean")
    asked = np.mean([len(nominal.prompt(i)) for i in range(min(nominal.num_requests, 1000))])
    extra = max(0, round(prompt - asked)) if prompt else 0
    return load_inference_perf(experiment.client, seed, prompt_extra=extra, duration_scale=scale) if extra else nominal


def validate(
    experiment: Experiment,
    hardware,
    model_config=None,
    seed: int = 0,
    profile=None,
    overrides: dict[str, Any] | None = None,
    scale: float = 1.0,
    on_step=None,
) -> Validation:
    """Simulate ``experiment`` on ``hardware`` (``model_config``: the model's config.json, else the shipped one
    the server's model id names; ``profile``: a ready profile instead of either; ``scale``: each stage cut to
    that share of its duration; ``on_step``: an observer of the engine's steps)."""
    config = engine_config(experiment, overrides)
    if profile is None:
        profile = experiment_profile(experiment, hardware, model_config, config)
    workload = experiment_workload(experiment, seed, scale)
    start = time.perf_counter()
    outcome = SimJob(workload, "vllm-v1", config, profile, record_timeseries=False).run(on_step)
    simulate_s = time.perf_counter() - start
    counted = counted_outputs(experiment, workload.client_log, seed, workload.config.ignore_eos)
    records = outcome.result.requests
    simulated = run_reports(workload, records, profile.serving_seconds, counted)
    return Validation(experiment, simulated, simulate_s, workload.num_requests, profile, list(records))


def counted_outputs(experiment: Experiment, log, seed: int = 0, ignore_eos: bool = True) -> dict[str, int]:
    """The output tokens the client counts for each answered request: drawn from its stage's recorded
    distribution, evenly through its quantiles (in a seeded order), independently of the request's latency,
    its lowest counts stretched to the recorded mean of their inverse (``stretch_tail``) where the server
    ignored EOS; where it stopped at EOS, a count and its latency go together and that mean says nothing."""
    rng = np.random.default_rng(seed)
    counted: dict[str, int] = {}
    by_stage: dict[int, list[str]] = {}
    for c in log:
        if c.outcome == "ok":
            by_stage.setdefault(c.stage, []).append(c.request_id)
    for stage, ids in by_stage.items():
        report = experiment.recorded.get(f"stage_{stage}_lifecycle_metrics.json", {}).get("successes", {})
        recorded = report.get("output_len")
        if not recorded:
            continue
        u = (rng.permutation(len(ids)) + 0.5) / len(ids)
        target = inverse_count_mean(report) if ignore_eos else None
        drawn = stretch_tail(np.rint(quantile_values(recorded, u)), u < COARSE_TAIL, target)
        for request_id, n in zip(ids, drawn):
            counted[request_id] = int(n)
    return counted


COARSE_TAIL = 0.01  # below its 1st percentile a report pins the counts at two points only (min and p0.1)


def inverse_count_mean(successes: dict) -> float | None:
    """The mean over a stage's answered requests of 1/count (0 for a count of 0), as the report implies it.

    A request's time per output token is its latency over the client's count; the count depends only on the
    text (these runs generate every request's ``output_len`` tokens: ``ignore_eos``), the latency only on the
    server, so the mean time per token is the mean latency times this mean."""
    latency = successes.get("latency") or {}
    per_token = (latency.get("normalized_time_per_output_token") or {}).get("mean")
    e2e = (latency.get("request_latency") or {}).get("mean")
    return per_token / e2e if per_token and e2e else None


def stretch_tail(counts: np.ndarray, tail: np.ndarray, target: float | None) -> np.ndarray:
    """``counts`` with the non-zero ones in ``tail`` scaled by the one factor (within 1/256 to 256) that brings
    their mean inverse closest to ``target``.

    The mean of per-request time per token is set by the few requests with a handful of counted tokens, and a
    report's quantiles place them only roughly: interpolated, they missed that mean by +17 % (Llama-2-7B's
    base-model text) to -30 % (Llama-2-70B reasoning). The report's own mean time per token fixes it
    (``inverse_count_mean``); only the tail moves, so the report's quantiles from the 1st percentile up stay."""
    scaled = tail & (counts > 0)
    if target is None or not scaled.any():
        return counts

    def stretched(log_k: float) -> np.ndarray:
        return np.where(scaled, np.maximum(1.0, np.rint(counts * np.exp(log_k))), counts)

    low, high = -math.log(256.0), math.log(256.0)  # the inverse mean falls as the factor grows
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_inverse(stretched(middle)) > target else (low, middle)
    return min((stretched(low), stretched(high)), key=lambda c: abs(mean_inverse(c) - target))


def mean_inverse(counts: np.ndarray) -> float:
    """The mean of 1/count, a count of 0 counting 0 (inference-perf's time per token for no tokens)."""
    counts = np.asarray(counts, dtype=float)
    return float(np.mean(np.divide(1.0, counts, out=np.zeros(len(counts)), where=counts > 0)))


def quantile_values(distribution: dict[str, float], u: np.ndarray) -> np.ndarray:
    """A recorded distribution's values at probabilities ``u``: its quantiles (min, percentiles, max) interpolated."""
    points = [(0.0, distribution["min"])]
    points += [(p / 100, distribution["median" if p == 50 else f"p{p:g}"]) for p in PERCENTILES]
    points.append((1.0, distribution["max"]))
    return np.interp(u, [p for p, _ in points], [v for _, v in points])


def mean_errors(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean absolute relative error per metric and statistic over ``rows`` (``e2e_mean``, ``ttft_p99``, ...)."""
    out = {}
    for metric, _ in METRICS:
        for stat in STATS:
            errs = [abs(r[f"err_{stat}"]) for r in rows if r["metric"] == metric and np.isfinite(r[f"err_{stat}"])]
            out[f"{metric}_{stat}"] = float(np.mean(errs)) if errs else float("nan")
    return out

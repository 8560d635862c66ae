"""The real-model side of the ``engine`` CLI: ``engine run --executor hf`` and ``engine verify``.

Command bodies live here; ``cli/app.py`` only declares the options and calls in. Nothing here
imports torch at module level, so the CLI starts fast when the simulator is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ExecutorOpt = Annotated[str, typer.Option("--executor", "-e", help="sim (cost-model simulator) or hf (a real transformers model)")]
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="hf executor: smollm2-135m, tiny-llama, tiny-qwen2, tiny-gpt2, or a local model folder / .gguf file")]
PromptOpt = Annotated[Optional[list[str]], typer.Option("--prompt", help="hf executor: a prompt to complete (repeatable); without it, a workload of built-in real prompts")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", min=1, help="hf executor: tokens to generate per request at most")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", min=0.0, help="hf executor: 0 is greedy")]
RawOpt = Annotated[bool, typer.Option("--raw", help="hf executor: do not wrap prompts in the model's chat template")]
BackendOpt = Annotated[Optional[str], typer.Option("--attention", help="attention backend: torch, triton or loop (default: triton on CUDA, torch otherwise)")]
ThreadsOpt = Annotated[int, typer.Option("--threads", min=0, help="torch CPU threads (0: torch's default)")]


def _load(model: str):
    from kvsched.executors.hf_models import load_model

    return load_model(model)


def run_command(policy, policy_opt, overrides, seed, num_requests, rate, output, quiet, model, prompts,
                max_tokens, temperature, raw=False, backend=None, threads=1) -> dict:
    """Run prompts (given, or the built-in real prompts) through POLICY on a real model; print text or a summary."""
    from kvsched.cli.common import build_config, console, err_console, parse_pairs, summary_table
    from kvsched.executors.hf import hf_engine
    from kvsched.executors.hf_prompts import all_prompts
    from kvsched.metrics.requests import RequestMetrics, summarize
    from kvsched.core.plugins import load_policy
    from kvsched.core.request import Request, SamplingParams

    from kvsched.workloads import check_options

    check_options(num_requests=num_requests, rate=rate)
    load_policy(policy)
    config = build_config(overrides)
    if output is not None:
        from kvsched.reporting.destination import check_folder

        check_folder(Path(output))
    err_console.print(f"loading {model} ...", highlight=False)
    loaded = _load(model)
    engine = hf_engine(loaded, config, policy, parse_pairs(policy_opt, "--policy-opt"), backend=backend,
                       num_threads=threads or None, seed=seed)
    pool = all_prompts()
    texts = list(prompts) if prompts else [pool[i % len(pool)] for i in range(num_requests or 16)]
    gaps = _arrivals(len(texts), rate, seed)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed if temperature > 0 else None)
    requests = [
        Request(request_id=f"p{i}", prompt_token_ids=tuple(loaded.encode_prompt(t, chat=not raw)), sampling=sampling, arrival_time=gaps[i])
        for i, t in enumerate(texts)
    ]
    err_console.print(f"running {len(requests)} request(s) on {model} ({engine.executor.backend} attention, policy {engine.policy_name})", highlight=False)
    engine.run(requests)
    if prompts:
        for req in requests:
            for seq in engine.groups[req.request_id].seqs:
                console.print(loaded.tokenizer.decode(seq.output, skip_special_tokens=True).strip(), highlight=False, markup=False)
    metrics = [RequestMetrics.of(g) for g in engine.groups.values()]
    summary = summarize(engine, metrics, profile=f"real: {model}", executor="hf", model=model)
    if not prompts or not quiet:
        console.print(summary_table(summary))
    if output is not None:
        from kvsched.experiments.simulation import RunResult
        from kvsched.reporting.files import write_results

        for path in write_results(RunResult(engine, metrics, summary), Path(output)):
            console.print(f"wrote {path}", highlight=False)
    return summary


def _arrivals(n: int, rate: float | None, seed: int) -> list[float]:
    """Poisson arrival times at ``rate`` requests/s, or all at time 0 without a rate."""
    if not rate:
        return [0.0] * n
    import random

    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def verify(
    model: ModelOpt = "tiny-llama",
    scenario: Annotated[Optional[list[str]], typer.Option("--scenario", help="only these scenarios (repeatable)")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1, help="prompts per scenario")] = 4,
    max_tokens: MaxTokensOpt = 12,
    backend: BackendOpt = None,
    threads: ThreadsOpt = 1,
    device: Annotated[Optional[str], typer.Option("--device", help="move the model and the KV cache here, e.g. cuda")] = None,
) -> None:
    """Check that our engine's greedy output equals transformers' generate() token for token on MODEL."""
    from rich.table import Table

    from kvsched.cli.common import console, err_console, fail
    from kvsched.executors.hf_verify import scenarios, verify as run_verify

    known = list(scenarios(max_tokens, [1]))
    for name in scenario or []:
        if name not in known:
            fail(f"unknown scenario {name!r}; choose from {', '.join(known)}")
    import torch

    if threads:
        torch.set_num_threads(threads)
    err_console.print(f"loading {model} ...", highlight=False)
    loaded = _load(model)
    if device:
        loaded.model.to(device)
    results = run_verify(loaded, scenario or None, num_prompts=num_prompts, max_new_tokens=max_tokens, backend=backend)
    table = Table(title=f"{model}: our engine vs generate() (greedy, batch 1 per prompt)")
    for col in ("scenario", "equal", "max|Δlogit|", "preempt r/s", "CoW", "prefix hits", "mixed", "mismatch"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    for r in results:
        equal = sum(c.first_mismatch is None for c in r.checks)
        diffs = [c.max_logit_diff for c in r.checks if c.max_logit_diff is not None]
        bad = next((c for c in r.checks if not c.ok), None)
        where = "-" if bad is None else f"{bad.request_id}/{bad.sample} at {bad.first_mismatch} (top-2 margin {bad.margin if bad.margin is None else f'{bad.margin:.2g}'})"
        table.add_row(r.scenario, f"{equal}/{len(r.checks)}", f"{max(diffs, default=0):.1e}", "%d/%d" % r.preemptions,
                      str(r.blocks_copied), str(r.cached_tokens), str(r.mixed_steps), where)
    console.print(table)
    if not all(r.ok for r in results):
        fail("outputs differ from generate() (see the table; a tiny top-2 margin means a near-tie in float noise)", code=1)
    console.print(f"all {sum(len(r.checks) for r in results)} sequences equal generate() token for token", highlight=False)


def register(app: typer.Typer) -> None:
    from kvsched.cli.common import cli_errors

    app.command("verify")(cli_errors(verify))

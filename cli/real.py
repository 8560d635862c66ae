"""The real-model side of the ``engine`` CLI: ``engine run --executor hf`` and ``engine verify``.

Command bodies live here; ``cli/app.py`` only declares the options and calls in. Nothing here
imports torch at module level, so the CLI starts fast when the simulator is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvsched.cli.common import QuietOpt, console, flag

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

ExecutorOpt = Annotated[
    str, typer.Option("--executor", "-e", help="sim (cost-model simulator) or hf (a real transformers model)")
]
DEFAULT_MODEL = "smollm2-135m"  # the real pretrained model, for engine run --executor hf and engine verify alike
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="smollm2-135m, tiny-llama, tiny-qwen2, tiny-gpt2 (seeded random, fast), or a local model folder / .gguf "
        "file",
    ),
]
PromptOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt",
        help="hf executor: a prompt to complete (repeatable); without it, a workload of built-in real prompts",
    ),
]
MaxTokensOpt = Annotated[
    int, typer.Option("--max-tokens", min=1, max=1 << 31, help="hf executor: tokens to generate per request at most")
]
TemperatureOpt = Annotated[float, typer.Option("--temperature", min=0.0, max=100.0, help="hf executor: 0 is greedy")]
RawOpt = Annotated[bool, flag("--raw", help="hf executor: do not wrap prompts in the model's chat template")]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--attention", help="attention backend: torch, triton or loop (default: triton on CUDA, torch otherwise)"
    ),
]
ThreadsOpt = Annotated[int, typer.Option("--threads", min=0, max=1024, help="torch CPU threads (0: torch's default)")]


def _keep_tqdm_out() -> None:
    """Keep the GGUF converter's progress bars out of our output (they would garble the loading
    spinner on a terminal and fill a log when piped). tqdm reads ``TQDM_DISABLE`` when it is first
    imported, by torch: call this before anything imports torch."""
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")


def _load(model: str, quiet: bool):
    """The model, with a spinner and the time it takes."""
    from kvsched.cli.common import working
    from kvsched.executors.hf_models import load_model

    with working(quiet, f"loading {model}"):
        return load_model(model)


class Streamer:
    """Prints completions as they come (an ``on_step`` observer): one prompt's text token by token,
    several prompts' each whole once its request ends, and for a request that did not finish, why."""

    def __init__(self, engine, loaded, requests, out: Console | None = None) -> None:
        self.engine, self.tokenizer, self.out = engine, loaded.tokenizer, out or console
        self.ids = {r.request_id for r in requests}
        self.one = requests[0].request_id if len(requests) == 1 and requests[0].sampling.n == 1 else None
        self.shown = ""

    def __call__(self, report) -> None:
        if self.one is not None:
            self._grow(
                self._text(self.engine.sequence_groups[self.one].seqs[0]).rstrip("\ufffd")
            )  # a partial character waits for its bytes
        for view in report.finished:
            if view.request_id in self.ids:
                self._finished(self.engine.sequence_groups[view.request_id])

    def _text(self, seq) -> str:
        return self.tokenizer.decode(seq.output, skip_special_tokens=True).strip()

    def _grow(self, text: str) -> None:
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.out.file.write(text[len(self.shown) :])
            self.out.file.flush()
            self.shown = text

    def _finished(self, group) -> None:
        from kvsched.core.sequence import SequenceStatus

        if self.one is not None:
            self._grow(self._text(group.seqs[0]))
            self.out.print()
        else:
            for seq in group.seqs:
                self.out.print(self._text(seq), highlight=False, markup=False)
        if group.status in (
            SequenceStatus.FINISHED_IGNORED,
            SequenceStatus.FINISHED_ABORTED,
        ):  # say why, with the sizes that decide
            config = self.engine.config
            self.out.print(
                f"[{group.request_id}: {group.status.name.removeprefix('FINISHED_').lower()} after "
                f"{group.num_generated_tokens} generated token(s): {group.finish_detail or 'no reason recorded'}; "
                f"its prompt has {group.request.prompt_len} tokens, the GPU KV cache {config.num_gpu_blocks} "
                f"blocks of {config.block_size}]",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )


def run_command(
    policy,
    policy_opt,
    overrides,
    seed,
    num_requests,
    rate,
    output,
    quiet,
    model,
    prompts,
    max_tokens,
    temperature,
    raw=False,
    backend=None,
    threads=1,
) -> dict:
    """Run prompts (given, or the built-in real prompts) through POLICY on a real model: stream the
    text (given prompts) or a progress bar (the built-in ones), then the summary and its warnings."""
    _keep_tqdm_out()
    from kvsched.cli.common import build_config, err_console, policy_options, progress_bar
    from kvsched.cli.tables import print_summary
    from kvsched.core.request import Request, SamplingParams
    from kvsched.executors.hf import hf_engine
    from kvsched.executors.hf_prompts import all_prompts
    from kvsched.experiments.simulation import FinishedCount, fan_out
    from kvsched.metrics.requests import RequestMetrics, summarize
    from kvsched.workloads import check_options

    check_options(num_requests=num_requests, rate=rate)
    options = policy_options(policy, policy_opt)
    config = build_config(overrides)
    if output is not None:
        from kvsched.cli.common import input_files
        from kvsched.reporting.destination import RUN_FILES, check_apart, check_folder

        check_folder(Path(output))
        check_apart({"--output": (Path(output), RUN_FILES)}, input_files(policies=[policy]))
    loaded = _load(model, quiet)

    engine = hf_engine(loaded, config, policy, options, backend=backend, num_threads=threads or None, seed=seed)
    pool = all_prompts()
    texts = list(prompts) if prompts else [pool[i % len(pool)] for i in range(num_requests or 16)]
    gaps = _arrivals(len(texts), rate, seed)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed if temperature > 0 else None)
    requests = [
        Request(
            request_id=f"p{i}",
            prompt_token_ids=tuple(loaded.encode_prompt(t, chat=not raw)),
            sampling=sampling,
            arrival_time=gaps[i],
        )
        for i, t in enumerate(texts)
    ]
    if not quiet:
        err_console.print(
            f"running {len(requests)} request(s) on {model} ({engine.executor.backend} attention, policy "
            f"{engine.policy_name})",
            highlight=False,
        )
    with progress_bar(quiet or bool(prompts), "generating") as bar:  # given prompts show their text instead
        task = bar.add_task("run", total=len(requests))
        counted = FinishedCount(lambda n: bar.advance(task, n))
        engine.run(requests, on_step=fan_out([Streamer(engine, loaded, requests) if prompts else None, counted]))
    metrics = [RequestMetrics.of(g) for g in engine.sequence_groups.values()]
    summary = summarize(engine, metrics, profile=f"real: {model}", executor="hf", model=model)
    print_summary(summary)
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
    model: ModelOpt = DEFAULT_MODEL,
    scenario: Annotated[list[str] | None, typer.Option("--scenario", help="only these scenarios (repeatable)")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1, max=10_000, help="prompts per scenario")] = 4,
    max_tokens: MaxTokensOpt = 12,
    backend: BackendOpt = None,
    threads: ThreadsOpt = 1,
    device: Annotated[
        str | None, typer.Option("--device", help="move the model and the KV cache here, e.g. cuda")
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Check that our engine's greedy output equals transformers' generate() token for token on MODEL."""
    _keep_tqdm_out()
    from kvsched.cli.common import fail, progress_bar
    from kvsched.executors.hf_verify import scenarios
    from kvsched.executors.hf_verify import verify as run_verify

    known = list(scenarios(max_tokens, [1]))
    for name in scenario or []:
        if name not in known:
            fail(f"unknown scenario {name!r}; choose from {', '.join(known)}")
    import torch

    if threads:
        torch.set_num_threads(threads)
    loaded = _load(model, quiet)
    if device:
        loaded.model.to(device)
    with progress_bar(quiet, "verifying", "scenarios") as bar:
        task = bar.add_task("verify", total=len(scenario or known))
        results = run_verify(
            loaded,
            scenario or None,
            num_prompts=num_prompts,
            max_new_tokens=max_tokens,
            backend=backend,
            on_done=lambda _result: bar.advance(task),
        )
    console.print(verify_table(model, results))
    if not all(r.ok for r in results):
        fail(
            "outputs differ from generate() (see the table; a tiny top-2 margin means a near-tie in float noise)",
            code=1,
        )
    console.print(
        f"all {sum(len(r.checks) for r in results)} sequences equal generate() token for token", highlight=False
    )


def verify_table(model: str, results: list) -> Table:
    """One row per scenario, narrow enough for an 80-column terminal (two-line headers)."""
    from rich.table import Table

    table = Table(title=f"{model}: our engine vs generate() (greedy)")
    for col in (
        "scenario",
        "equal",
        "max\nΔlogit",
        "preempt\nr/s",
        "CoW",
        "prefix\nhits",
        "mixed\nsteps",
        "first\nmismatch",
    ):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in results:
        equal = sum(c.first_mismatch is None for c in r.checks)
        diffs = [c.max_logit_diff for c in r.checks if c.max_logit_diff is not None]
        bad = next((c for c in r.checks if not c.ok), None)
        where = (
            "-"
            if bad is None
            else f"{bad.request_id}/{bad.sample} at {bad.first_mismatch}, top-2 margin "
            f"{bad.margin if bad.margin is None else f'{bad.margin:.2g}'}"
        )
        table.add_row(
            r.scenario,
            f"{equal}/{len(r.checks)}",
            f"{max(diffs, default=0):.1e}",
            "{}/{}".format(*r.preemptions),
            str(r.blocks_copied),
            str(r.cached_tokens),
            str(r.mixed_steps),
            where,
        )
    return table


def register(app: typer.Typer) -> None:
    from kvsched.cli.common import cli_errors

    app.command("verify")(cli_errors(verify))

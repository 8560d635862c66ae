"""Token-exact checks: our engine on a real model against transformers' own ``generate()``.

The reference is ``generate()`` greedy, batch 1, one prompt at a time (padding would change its
numerics). Our side runs the same prompts through the engine under a *scenario* that exercises a
mechanism: packed mixed prefill/decode steps, chunked prefill, preemption by recompute or swap in
the middle of generation, ``n > 1`` with copy-on-write, prefix-cache hits. Free block lists are
shuffled so block tables are non-contiguous. Tokens must be equal; logits are compared with a
tolerance, and a differing token reports the reference's top-2 margin at that step (a near-tie
there means float noise, not a bug).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvsched.core.config import EngineConfig
from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import Request, SamplingParams
from kvsched.executors.hf import hf_engine
from kvsched.executors.hf_models import ByteTokenizer, LoadedModel

LOGIT_ATOL = 1e-3


class MixedBatches:
    """Verification policy: decode every running group and admit waiting ones in the same step.

    ``chunk`` caps the prefill tokens a group computes per step (chunked prefill), so prompts
    are spread over several steps while other sequences decode.
    """

    name = "mixed-batches"

    def __init__(self, chunk: int | None = None) -> None:
        self.chunk = chunk

    @hookimpl
    def select_batch(self, step):
        for group in step.running:
            if not step.was_touched(group):
                step.advance(group, max_tokens=self.chunk)
        if not step.swapped:
            for group in step.waiting:
                if step.admit(group, max_tokens=self.chunk) is not Outcome.SCHEDULED:
                    break
        for group in step.swapped:
            if step.swap_in(group) is not Outcome.SCHEDULED:
                break
        return True


@dataclass(frozen=True)
class Scenario:
    name: str
    config: EngineConfig
    policy: object = "vllm-default"
    n: int = 1
    shared_prefix: bool = False  # prompts share a leading part (prefix caching hits)
    arrive_every: int = 1  # steps between arrivals: staggered so prefills meet decodes

    def policy_object(self):
        return MixedBatches(self.policy[1]) if isinstance(self.policy, tuple) else self.policy


def scenarios(max_new_tokens: int, prompt_lens: Sequence[int], block_size: int = 4) -> dict[str, Scenario]:
    """The standard scenarios, sized so that preemption really happens for these lengths."""
    longest = max(prompt_lens) + max_new_tokens
    per_seq = -(-longest // block_size)
    roomy = EngineConfig(
        block_size=block_size,
        num_gpu_blocks=per_seq * len(prompt_lens) * 3 + 8,
        num_cpu_blocks=per_seq * len(prompt_lens) * 3,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
    )
    tight = dict(
        block_size=block_size,
        num_gpu_blocks=per_seq + 2,
        num_cpu_blocks=per_seq * len(prompt_lens) * 3,
        max_num_batched_tokens=2048,
        max_num_seqs=64,
        watermark=0.0,
    )
    tight_n = dict(tight, num_gpu_blocks=per_seq * 3 + 2)
    return {
        "mixed": Scenario("mixed", roomy, ("mixed", None)),
        "chunked": Scenario("chunked", roomy, ("mixed", 5)),
        "recompute": Scenario("recompute", EngineConfig(**tight, preemption_mode="recompute"), arrive_every=0),
        "swap": Scenario("swap", EngineConfig(**tight, preemption_mode="swap"), arrive_every=0),
        "n3-cow": Scenario("n3-cow", roomy, n=3),
        "n3-swap": Scenario("n3-swap", EngineConfig(**tight_n, preemption_mode="swap"), n=3, arrive_every=0),
        "prefix": Scenario(
            "prefix", roomy.model_copy(update={"enable_prefix_caching": True}), shared_prefix=True, arrive_every=3
        ),
        # vLLM V1's mechanics (a null block, prefix caching, n > 1 fanned out into children) on the real cache
        "v1": Scenario(
            "v1",
            roomy.model_copy(update={"vllm_engine": "v1", "enable_prefix_caching": True}),
            "vllm-v1",
            n=2,
            shared_prefix=True,
        ),
    }


@dataclass
class SequenceCheck:
    request_id: str
    sample: int
    expected: list[int]
    got: list[int]
    max_logit_diff: float | None = None
    first_mismatch: int | None = None
    margin: float | None = None  # reference top-1 minus top-2 logit at the first mismatch

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None and (self.max_logit_diff is None or self.max_logit_diff <= LOGIT_ATOL)


@dataclass
class ScenarioResult:
    scenario: str
    checks: list[SequenceCheck] = field(default_factory=list)
    preemptions: tuple[int, int] = (0, 0)  # recompute, swap
    blocks_copied: int = 0
    cached_tokens: int = 0
    mixed_steps: int = 0  # steps that ran a prefill chunk and a decode together

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def reference(loaded: LoadedModel, prompt: Sequence[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy ``generate()`` of one prompt (batch 1, HF's sdpa attention): tokens and per-step logits."""
    model = loaded.model
    if model.config._attn_implementation != "sdpa":
        model.set_attn_implementation("sdpa")
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([list(prompt)], device=device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=loaded.eos_token_id,
            pad_token_id=loaded.eos_token_id,
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, [row[0].float().cpu() for row in out.logits]


def _shuffle_free_blocks(engine, seed: int) -> None:
    """Randomise the GPU pool's free order so block tables are scattered (test harness only)."""
    pool = engine.scheduler.block_manager.gpu
    blocks = pool.allocate_many(pool.num_free)
    random.Random(seed).shuffle(blocks)
    pool.release_many(blocks)  # freed in that order, they are taken in its reverse


def random_prompts(
    loaded: LoadedModel, num: int = 4, seed: int = 0, shared_prefix: bool = False, lengths=(3, 11, 17, 26)
) -> list[list[int]]:
    """Seeded random token-id prompts of mixed lengths (a few tokens up to several blocks), EOS excluded."""
    rng = random.Random(seed)
    vocab = 256 if isinstance(loaded.tokenizer, ByteTokenizer) else loaded.model.config.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(9)] if shared_prefix else []
    prompts = []
    for i in range(num):
        n = lengths[i % len(lengths)]
        body = [rng.randrange(vocab) for _ in range(n)]
        prompts.append([t for t in prefix + body if t != loaded.eos_token_id])
    return prompts


def run_scenario(
    loaded: LoadedModel,
    scenario: Scenario,
    prompts: list[list[int]],
    max_new_tokens: int,
    refs: dict[tuple[int, ...], tuple[list[int], list[torch.Tensor]]],
    backend: str | None = None,
    seed: int = 0,
) -> ScenarioResult:
    """Run the prompts through the engine under ``scenario`` and compare with the references."""
    engine = hf_engine(loaded, scenario.config, scenario.policy_object(), backend=backend, record_logits=True)
    _shuffle_free_blocks(engine, seed)
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_token_ids=tuple(p),
            sampling=SamplingParams(n=scenario.n, max_tokens=max_new_tokens),
        )
        for i, p in enumerate(prompts)
    ]
    result = ScenarioResult(scenario.name)
    pending = list(requests)
    step = 0
    while pending or engine.has_unfinished():
        while pending and (
            scenario.arrive_every == 0 or step % scenario.arrive_every == 0 or not engine.has_unfinished()
        ):
            engine.add_request(pending.pop(0))
            if scenario.arrive_every:
                break
        report = engine.step()
        out = report.output
        result.blocks_copied += len(out.blocks_to_copy)
        if any(sg.is_prefill for sg in out.scheduled) and any(not sg.is_prefill for sg in out.scheduled):
            result.mixed_steps += 1
        step += 1
        if step > 10_000:
            raise RuntimeError(f"scenario {scenario.name} did not finish")
    for req in requests:
        group = engine.sequence_groups[req.request_id]
        result.preemptions = (
            result.preemptions[0] + group.num_recompute_preemptions,
            result.preemptions[1] + group.num_swap_preemptions,
        )
        expected, ref_logits = refs[req.prompt_token_ids]
        for k, seq in enumerate(group.seqs):
            check = SequenceCheck(req.request_id, k, expected, list(seq.output))
            mismatch = next((i for i, (a, b) in enumerate(zip(expected, seq.output)) if a != b), None)
            if mismatch is None and len(expected) != len(seq.output):
                mismatch = min(len(expected), len(seq.output))
            check.first_mismatch = mismatch
            if mismatch is not None and mismatch < len(ref_logits):
                top2 = torch.topk(ref_logits[mismatch], 2).values
                check.margin = float(top2[0] - top2[1])
            ours = engine.executor.logits.get(seq.seq_id, [])
            if k == 0 and ours:
                upto = min(len(ours), len(ref_logits), mismatch if mismatch is not None else len(ours))
                diffs = [float((a - b).abs().max()) for a, b in zip(ours[:upto], ref_logits[:upto])]
                check.max_logit_diff = max(diffs, default=0.0)
            result.checks.append(check)
    result.cached_tokens = engine.executor.prefix_hit_tokens
    return result


def verify(
    loaded: LoadedModel,
    names: Sequence[str] | None = None,
    num_prompts: int = 4,
    max_new_tokens: int = 12,
    backend: str | None = None,
    prompts: list[list[int]] | None = None,
    seed: int = 0,
    on_done: Callable[[ScenarioResult], None] | None = None,
) -> list[ScenarioResult]:
    """Every scenario (or ``names``) for one model, ``on_done`` told of each; references are computed once per
    prompt."""
    plain = prompts or random_prompts(loaded, num_prompts, seed)
    prefixed = prompts or random_prompts(loaded, num_prompts, seed + 1, shared_prefix=True)
    lens = [len(p) for p in plain + prefixed]
    table = scenarios(max_new_tokens, lens)
    refs: dict[tuple[int, ...], tuple[list[int], list[torch.Tensor]]] = {}
    results = []
    for name in names or list(table):
        scenario = table[name]
        use = prefixed if scenario.shared_prefix else plain
        for p in use:
            if tuple(p) not in refs:
                refs[tuple(p)] = reference(loaded, p, max_new_tokens)
        results.append(run_scenario(loaded, scenario, use, max_new_tokens, refs, backend, seed))
        if on_done is not None:
            on_done(results[-1])
    return results

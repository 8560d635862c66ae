"""Under V1's mechanics a step names in the prefix cache every full block it fills as it takes the blocks, so its
completion names none (mechanics/completion.py names them on apply under v0 only): after every applied step each running
sequence's computed full blocks are already named, whatever chunking, preemption, drafts and shared prefixes do."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.executors.simulated import SimulatedExecutor

SYSTEM = list(range(1000, 1040))  # a shared system prompt: 10 blocks of 4, so prefixes hit


@st.composite
def runs(draw):
    config = EngineConfig(
        block_size=4,
        num_gpu_blocks=draw(st.integers(24, 96)),  # short of blocks at the low end: preemptions by recompute
        max_model_len=256,
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 64, 256])),  # small: prompts run in chunks
        max_num_seqs=draw(st.integers(1, 8)),
        enable_prefix_caching=True,
        num_speculative_tokens=draw(st.sampled_from([0, 0, 2])),
    )
    requests = []
    for i in range(draw(st.integers(1, 8))):
        own = draw(st.lists(st.integers(0, 50), min_size=1, max_size=40))
        output = draw(st.integers(1, 40))
        prompt = (SYSTEM[: draw(st.sampled_from([0, 8, 40]))] + own)[:120]
        requests.append(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=prompt,
                output_len=output,
                arrival_time=0.01 * draw(st.integers(0, 20)),
                sampling=SamplingParams(max_tokens=output, n=draw(st.sampled_from([1, 1, 2]))),
            )
        )
    return config, requests


@given(runs())
def test_every_full_block_a_v1_step_computed_is_named_before_its_completion(run):
    config, requests = run
    engine = Engine(config, "vllm-v1", SimulatedExecutor())
    assert not engine.completion.caching  # V1's completion names nothing: the step did
    bm, size, unnamed = engine.scheduler.block_manager, config.block_size, []

    def check(report):
        for group in engine.scheduler.running:
            for seq in group.seqs:
                named = bm._registered.get(seq.seq_id, 0)
                if seq.status.name == "RUNNING" and named < seq.num_computed_tokens // size:
                    unnamed.append((report.step, seq.seq_id, named, seq.num_computed_tokens))

    engine.run(requests, on_step=check)
    assert not unnamed, unnamed[:3]
    assert all(g.is_finished for g in engine.sequence_groups.values())

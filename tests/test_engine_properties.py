"""The engine under random workloads, configs and aborts: it always terminates cleanly.

Every step is audited (allocator invariants, queue/status agreement, running-sequence count);
budgets are checked on every output; the reference policy's step shapes are checked; at the end
every request is in a final state and no block is held.
"""

from __future__ import annotations

from helpers import engine_configs, req
from hypothesis import given, note
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig
from kvsched.executors.simulated import SimulatedExecutor

configs = engine_configs(delay_factor=st.sampled_from([0.0, 0.5, 2.0]), enable_prefix_caching=st.booleans())
requests = st.lists(
    st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(1, 3), st.floats(0, 5, allow_nan=False)),
    min_size=1,
    max_size=16,
)


class CountingExecutor(SimulatedExecutor):
    """Checks, on the raw batch only an executor sees, that what the budget counted is what it
    computes, sequence by sequence."""

    def execute(self, output):
        assert output.num_batched_tokens == sum(n for s in output.scheduled for _, n in s.seq_chunks())
        return super().execute(output)


@given(config=configs, spec=requests, aborts=st.lists(st.integers(0, 15), max_size=4), abort_step=st.integers(0, 30))
def test_random_runs_finish_every_request_and_leak_nothing(config, spec, aborts, abort_step):
    cfg = EngineConfig(**config, audit_every_step=True)
    engine = Engine(cfg, "vllm-default", CountingExecutor())
    reqs = [req(f"r{i}", p, o, arrival=round(t, 3), n=n) for i, (p, o, n, t) in enumerate(spec)]
    total_tokens = sum(r.prompt_len + r.output_len * r.sampling.n for r in reqs)
    step_bound = 20 * total_tokens + 1000
    seen = {"steps": 0}

    def check(report):
        out = report.output
        seen["steps"] += 1
        assert out.num_batched_tokens == sum(s.num_tokens for s in out.scheduled) <= cfg.max_num_batched_tokens
        assert engine.scheduler.num_running_seqs <= cfg.max_num_seqs
        assert len({id(s.group) for s in out.scheduled}) == len(out.scheduled)
        if out.num_prefill_groups:  # vllm-default (no chunking): a step that admits prompts decodes nothing
            assert out.num_prefill_groups == len(out.scheduled)
        if out.blocks_to_swap_in:
            assert not out.preempted
        if seen["steps"] == abort_step:
            for i in aborts:
                engine.abort(f"r{i}")
        assert seen["steps"] < step_bound, "no termination within the step bound"

    engine.run(reqs, on_step=check)
    note(f"{seen['steps']} steps")
    assert not engine.has_unfinished()
    assert all(g.is_finished for g in engine._groups.values())
    assert engine.leaked_blocks == 0 and engine.scheduler.block_manager.audit() == []
    for g in engine._groups.values():
        if g.status.name in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"):
            assert all(len(s.output) >= 1 for s in g.seqs) and len(g.seqs) == g.request.sampling.n

"""Each rule of the reference policy, pinned on small hand-built situations (block size 4)."""

from __future__ import annotations

from helpers import ids, req, unit_engine

from kvsched.core.config import PreemptionMode
from kvsched.core.sequence import SequenceStatus


def scheduled(report):
    return [(s.group.request_id, s.num_tokens, s.is_prefill) for s in report.output.scheduled]


def test_fcfs_admission_and_a_prefill_step_has_no_decodes():
    e = unit_engine()
    for i in range(3):
        e.add_request(req(f"r{i}", prompt_len=8, output_len=5))
    first = e.step()
    assert scheduled(first) == [("r0", 8, True), ("r1", 8, True), ("r2", 8, True)]
    e.add_request(req("late", prompt_len=8, output_len=5, arrival=0.5))
    second = e.step()
    assert scheduled(second) == [("late", 8, True)]  # prefill-only: r0..r2 do not decode
    third = e.step()
    assert scheduled(third) == [("r0", 1, False), ("r1", 1, False), ("r2", 1, False), ("late", 1, False)]


def test_token_budget_stops_admission_head_of_line():
    e = unit_engine(max_num_batched_tokens=20, max_num_seqs=8)
    for i, n in enumerate((8, 8, 8, 2)):
        e.add_request(req(f"r{i}", prompt_len=n, output_len=3))
    assert ids(e.step().output.scheduled) == ["r0", "r1"]  # r2 would exceed 20; r3 fits but is behind it
    assert ids(e.scheduler.waiting) == ["r2", "r3"]


def test_max_num_seqs_counts_running_and_reserved_sequences():
    e = unit_engine(max_num_seqs=3)
    e.add_request(req("pair", prompt_len=4, output_len=5, n=2))
    e.add_request(req("a", prompt_len=4, output_len=5))
    e.add_request(req("b", prompt_len=4, output_len=5))
    assert ids(e.step().output.scheduled) == ["pair", "a"]  # 2 + 1 sequences; b would be the fourth
    assert e.scheduler.num_running_seqs == 3


def test_never_fitting_prompt_is_ignored_and_the_queue_moves_on():
    e = unit_engine(num_gpu_blocks=8, watermark=0.25)  # 2 watermark blocks: at most 6 blocks = 24 tokens
    e.add_request(req("huge", prompt_len=25, output_len=2))
    e.add_request(req("ok", prompt_len=4, output_len=2))
    report = e.step()
    assert ids(report.output.ignored) == ["huge"] and ids(report.output.scheduled) == ["ok"]
    huge = e._groups["huge"]
    assert huge.status is SequenceStatus.FINISHED_IGNORED and "never fit" in huge.finish_detail
    assert huge.view in report.finished


def test_prompt_longer_than_max_model_len_is_ignored():
    e = unit_engine(max_model_len=16)
    e.add_request(req("long", prompt_len=17, output_len=2))
    assert ids(e.step().output.ignored) == ["long"]
    assert "max_model_len" in e._groups["long"].finish_detail


def test_later_blocks_admission_head_of_line_above_the_watermark():
    e = unit_engine(num_gpu_blocks=10, watermark=0.2)  # 2 watermark blocks
    e.add_request(req("first", prompt_len=16, output_len=20))  # 4 blocks
    e.step()
    e.add_request(req("big", prompt_len=20, output_len=2, arrival=0.1))  # 5 more: 6 - 5 < 2 -> LATER
    e.add_request(req("small", prompt_len=1, output_len=2, arrival=0.2))
    report = e.step()
    assert scheduled(report) == [("first", 1, False)]  # nothing admitted: big is LATER, small waits behind
    assert ids(e.scheduler.waiting) == ["big", "small"]


def fill_until_preemption(e):
    """Step until a step preempts; return that report."""
    for _ in range(200):
        report = e.step()
        if report.output.preempted:
            return report
    raise AssertionError("no preemption happened")


def test_single_sequence_victim_is_recomputed_from_the_tail_to_the_front_of_waiting():
    e = unit_engine(num_gpu_blocks=6)
    for i in range(3):
        e.add_request(req(f"r{i}", prompt_len=7, output_len=12))  # 2 blocks each: the pool is full
    report = fill_until_preemption(e)
    ((victim, mode),) = report.output.preempted
    assert victim.request_id == "r2" and mode is PreemptionMode.RECOMPUTE  # the newest goes
    assert ids(report.output.scheduled) == ["r0", "r1"]
    assert ids(e.scheduler.waiting)[0] == "r2" and victim.status is SequenceStatus.WAITING
    victim = e._groups[victim.request_id]
    assert all(s.num_computed_tokens == 0 for s in victim.seqs)
    assert e.scheduler.block_manager.block_table(victim.seqs[0].seq_id) == ()


def test_recomputed_request_reprefills_prompt_plus_generated_tokens():
    e = unit_engine(num_gpu_blocks=6)
    for i in range(3):
        e.add_request(req(f"r{i}", prompt_len=7, output_len=12))
    report = fill_until_preemption(e)
    victim = report.output.preempted[0].group
    generated = len(e._groups[victim.request_id].seqs[0].output)
    for _ in range(100):
        r = e.step()
        hit = [s for s in r.output.scheduled if s.group is victim]
        if hit:
            assert hit[0].is_prefill and hit[0].num_tokens == 7 + generated
            return
    raise AssertionError("victim never resumed")


def test_multi_sequence_victim_is_swapped_to_the_back_of_swapped_and_blocks_prompts():
    e = unit_engine(num_gpu_blocks=9)
    e.add_request(req("solo", prompt_len=7, output_len=30))
    e.add_request(req("pair", prompt_len=7, output_len=30, n=2))
    report = fill_until_preemption(e)
    ((victim, mode),) = report.output.preempted
    assert victim.request_id == "pair" and mode is PreemptionMode.SWAP
    assert report.output.blocks_to_swap_out and ids(e.scheduler.swapped) == ["pair"]
    e.add_request(req("newcomer", prompt_len=2, output_len=2, arrival=e.clock.now()))
    nxt = e.step()
    assert "newcomer" not in ids(nxt.output.scheduled)  # swapped groups come first: no prefills


def test_swap_in_only_in_a_step_that_preempted_nothing():
    e = unit_engine(num_gpu_blocks=9)
    e.add_request(req("solo", prompt_len=7, output_len=30))
    e.add_request(req("pair", prompt_len=7, output_len=30, n=2))
    fill_until_preemption(e)
    saw_swap_in = False
    while e.has_unfinished():
        r = e.step()
        if r.output.blocks_to_swap_in:
            saw_swap_in = True
            assert not r.output.preempted and not r.output.blocks_to_swap_out
    assert saw_swap_in and e.leaked_blocks == 0


def test_forced_preemption_mode_wins():
    e = unit_engine(num_gpu_blocks=6, preemption_mode="swap")
    for i in range(3):
        e.add_request(req(f"r{i}", prompt_len=7, output_len=12))
    report = fill_until_preemption(e)
    assert report.output.preempted[0].mode is PreemptionMode.SWAP  # one sequence, swapped anyway


def test_swap_that_the_cpu_pool_cannot_hold_becomes_recompute():
    e = unit_engine(num_gpu_blocks=24, num_cpu_blocks=1)  # the pair alone fits; with solo it does not
    e.add_request(req("solo", prompt_len=7, output_len=30))
    e.add_request(req("pair", prompt_len=7, output_len=30, n=2))
    report = fill_until_preemption(e)
    assert report.output.preempted[0].mode is PreemptionMode.RECOMPUTE
    e.run()
    assert all(g.status is SequenceStatus.FINISHED_STOPPED for g in e._groups.values()) and e.leaked_blocks == 0


def test_delay_gate_holds_prompts_until_the_oldest_waited_long_enough():
    e = unit_engine(delay_factor=2.0)
    e.add_request(req("a", prompt_len=4, output_len=20))
    e.step()  # t 0 -> 1: nothing was running, so the gate was open
    e.step()  # decode; the last prompt step took 1 s, so the gate needs a 2 s wait
    e.add_request(req("b", prompt_len=4, output_len=5, arrival=2.0))
    waits = []
    for _ in range(4):
        r = e.step()
        waits.append(("b" in ids(r.output.scheduled), r.now - 1.0))
    assert waits[0][0] is False and waits[1][0] is False  # now - 2.0 = 0, 1: not > 2
    assert waits[2] == (False, 4.0)  # 4.0 - 2.0 = 2.0: not strictly greater
    assert waits[3] == (True, 5.0)


def test_delay_gate_is_open_when_nothing_runs():
    e = unit_engine(delay_factor=100.0)
    e.add_request(req("a", prompt_len=4, output_len=1))
    e.step()
    e.add_request(req("b", prompt_len=4, output_len=1, arrival=1.0))
    assert ids(e.step().output.scheduled) == ["b"]


def test_lone_request_decodes_when_its_exact_need_fits():
    """vLLM's worst-case check would preempt a lone request whose last block still has room."""
    e = unit_engine(num_gpu_blocks=2)
    e.add_request(req("lone", prompt_len=6, output_len=3))  # 2 blocks: pool full, 2 free slots in the last
    e.run()
    g = e._groups["lone"]
    assert g.status is SequenceStatus.FINISHED_STOPPED and g.num_recompute_preemptions == 0


def test_everything_finishes_and_frees_every_block():
    e = unit_engine(num_gpu_blocks=12, num_cpu_blocks=6, max_num_batched_tokens=32, max_num_seqs=16)
    for i in range(12):
        e.add_request(req(f"r{i}", prompt_len=3 + i, output_len=4 + (i * 7) % 11, n=1 + i % 3, arrival=i * 0.3))
    e.run()
    assert e.leaked_blocks == 0 and not e.has_unfinished()
    assert sum(g.num_swap_preemptions for g in e._groups.values()) > 0
    assert sum(g.num_recompute_preemptions for g in e._groups.values()) > 0


def test_request_with_more_sequences_than_max_num_seqs_is_ignored_not_stuck():
    """vLLM keeps such a request waiting forever and it blocks everyone behind it."""
    e = unit_engine(max_num_seqs=2)
    e.add_request(req("wide", prompt_len=4, output_len=2, n=3))
    e.add_request(req("next", prompt_len=4, output_len=2))
    report = e.step()
    assert ids(report.output.ignored) == ["wide"] and ids(report.output.scheduled) == ["next"]
    assert "max_num_seqs" in e._groups["wide"].finish_detail


def test_running_loop_ends_when_the_advanced_group_itself_is_preempted():
    """vLLM's running loop stops at a self-preemption; a later group that would now fit waits."""
    from kvsched.core.decisions import Preemption
    from kvsched.core.hookspecs import hookimpl
    from kvsched.policies.vllm_default import VllmDefault

    class GivesUpItself(VllmDefault):
        @hookimpl
        def choose_preemption(self, step, requester):
            return Preemption(requester)

    e = unit_engine(policy=GivesUpItself, num_gpu_blocks=3, max_num_seqs=8)
    for i in range(3):
        e.add_request(req(f"r{i}", prompt_len=4, output_len=5))  # one full block each: decoding needs a second
    assert ids(e.step().output.scheduled) == ["r0", "r1", "r2"]
    report = e.step()  # no free block: r0 gives itself up, which frees one that r1 could use
    assert [g.request_id for g, _ in report.output.preempted] == ["r0"]
    assert not report.output.scheduled
    assert ids(e.scheduler.running) == ["r1", "r2"]


def test_swap_in_needs_the_full_blocks_plus_the_block_each_next_token_touches():
    """vLLM 0.6.3's count, on the case where it differed from the old "all blocks plus one spare per
    sequence": with 1 block free, B (one partial block on the CPU) comes back, and A and B decode."""
    e = unit_engine(block_size=4, num_gpu_blocks=3, num_cpu_blocks=8, preemption_mode="swap")
    for rid, prompt in (("A", 4), ("C", 4), ("B", 2)):
        e.add_request(req(rid, prompt, 50))
    reports = [e.step() for _ in range(3)]
    assert sorted(ids(g for g, _ in reports[1].output.preempted)) == ["B", "C"] and e.cache.num_free_gpu_blocks == 0
    assert ids(reports[2].output.swapped_in) == ["B"] and sorted(ids(reports[2].output.scheduled)) == ["A", "B"]


def test_a_sequence_is_capped_once_longer_than_max_model_len():
    """vLLM v0 samples until a sequence is longer than max_model_len: a 4-token prompt with
    max_model_len 8 gets 5 tokens (V1 stops at 8 tokens, 4 generated)."""
    for engine, generated in (("v0", 5), ("v1", 4)):
        e = unit_engine(max_model_len=8, max_num_batched_tokens=8, max_num_seqs=8, vllm_engine=engine)
        e.add_request(req("a", 4, 16))
        (group,) = e.run()
        assert group.num_generated_tokens == generated and group.status is SequenceStatus.FINISHED_LENGTH_CAPPED

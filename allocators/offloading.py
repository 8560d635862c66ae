"""The engine's side of the CPU KV tier (``allocators/cpu_tier.py``), as vLLM's ``OffloadingConnector`` schedules it.

- **Stores**: each step offers the full blocks its requests compute, from the first one not yet offered, up to the
  prompt's end (``offload_prompt_only``, vLLM's default) or up to what the step computes; a store that finds no room
  is offered again the next time the request runs. A finishing request offers what it computed of its prompt.
  Stores complete at the end of the step's commit, all together (vLLM's worker completes them when the step has
  run, or later, overlapped with compute): a chunk stored in a step cannot be evicted by another store of that step.
- **Loads**: an admission looks up the blocks after its GPU prefix hit; the tier's ready run of them is copied into
  fresh GPU blocks, which join the GPU prefix cache, so the admission finds them as hits and holds them. The copies
  are the step's ``blocks_to_swap_in``, which the cost model times on its PCIe term. vLLM loads in a step of its own
  (the request holds its blocks, runs one step later): here the load and the first chunk share a step.
- A request's first admission, or its admission after a preemption, offers its blocks from the first again, or from
  after those it loaded (vLLM's chunk-level policy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.allocators.cpu_tier import CpuTier, Policy

if TYPE_CHECKING:
    from kvsched.allocators.block_manager import BlockManager
    from kvsched.allocators.shapes import Sequence


class Load:
    """What an admission took from the tier: the GPU hit's blocks, the keys loaded after it, the block moves."""

    __slots__ = ("request", "first", "keys", "blocks", "moves")

    def __init__(self, request: str, first: int, keys: list[int], blocks: list[int], moves: list[tuple[int, int]]):
        self.request, self.first, self.keys, self.blocks, self.moves = request, first, keys, blocks, moves


class Offloading:
    """A CPU tier of ``num_blocks`` blocks behind ``bm``'s GPU prefix cache; see the module docstring."""

    def __init__(self, bm: BlockManager, num_blocks: int, policy: Policy = "lru", prompt_only: bool = True) -> None:
        self.bm = bm
        self.tier = CpuTier(num_blocks, policy)
        self.prompt_only = prompt_only
        self.next_offer: dict[str, int] = {}  # request -> the first of its blocks not yet offered
        self.pending: list[tuple[Load, int, int]] = []  # this step's admissions: (load, cached tokens, frontier)
        self.writing: list[int] = []  # stored in this step's commit, pending until its end
        self.finished: list[tuple[str, list[int], int, int]] = []  # ended since the last step: their last offers
        self.gpu_hit_tokens = self.cpu_hit_tokens = self.reloaded_tokens = 0

    def load(self, request: str, seq: Sequence) -> Load:
        """Before ``seq`` is looked up for admission: its blocks after the GPU hit that the tier holds ready, put in
        the GPU prefix cache (at least one token is left to compute, as for a GPU hit)."""
        bm, gpu, size = self.bm, self.bm.gpu, self.bm.block_size
        hits = bm.cached_blocks(seq)
        full = (seq.num_tokens - 1) // size  # the blocks a hit may cover
        keys: list[int] = []
        if full > len(hits):
            for key in bm.content_hashes(seq, full)[len(hits) : full]:
                if not self.tier.is_ready(key) or key in gpu.hash_to_block:  # the GPU holds the rest of a broken run
                    break
                keys.append(key)
        if not keys:  # the GPU's blocks stay as they are (their eviction order too)
            return Load(request, len(hits), [], [], [])
        gpu.take_many(hits)  # the GPU hit must not be evicted to make room for what follows it
        keys = keys[: gpu.num_free]
        blocks = gpu.allocate_many(len(keys))
        gpu.register(blocks, keys)
        gpu.release_many(blocks)
        gpu.release_many(hits)
        return Load(request, len(hits), keys, blocks, [(self.tier.slot[k], b) for k, b in zip(keys, blocks)])

    def admitted(self, load: Load, cached_tokens: int | None, frontier: int) -> None:
        """The admission's outcome: ``cached_tokens`` its hits if admitted (else None, and the loaded copies are
        dropped); ``frontier`` what it had computed before a preemption, which the loaded blocks spare."""
        if cached_tokens is not None:
            self.pending.append((load, cached_tokens, frontier))
            return
        gpu = self.bm.gpu
        gpu.take_many(load.blocks)
        gpu.forget(load.blocks)
        gpu.release_many(load.blocks)

    def rollback(self) -> None:
        self.pending.clear()

    def commit(self, scheduled: list[tuple[str, Sequence, int]]) -> None:
        """The step is committed: its loads are counted, then its requests' computed blocks are offered, then what
        the requests that ended since the last step left."""
        size = self.bm.block_size
        for load, cached, frontier in self.pending:
            gpu_tokens = load.first * size
            cpu_tokens = max(0, min(len(load.keys) * size, cached - gpu_tokens))
            self.gpu_hit_tokens += cached - cpu_tokens
            self.cpu_hit_tokens += cpu_tokens
            self.reloaded_tokens += max(0, min(frontier, gpu_tokens + cpu_tokens) - gpu_tokens)
            if load.keys:
                self.tier.prepare_load(load.request, load.keys, load.first)
                self.tier.complete_load(load.keys)
            self.next_offer[load.request] = load.first + len(load.keys) if load.keys else 0
        self.pending.clear()
        for request, seq, num_tokens in scheduled:
            self.offer(request, seq, seq.num_computed_tokens + num_tokens)
        for request, keys, start, full in self.finished:
            self._store(request, keys, start, full)
            self.next_offer.pop(request, None)
            self.tier.finish(request)
        self.finished.clear()
        self.tier.complete_store(self.writing)  # written while the step runs: none is evictable before then
        self.writing.clear()

    def offer(self, request: str, seq: Sequence, num_tokens: int) -> None:
        """Store ``seq``'s full blocks within its first ``num_tokens`` tokens not offered yet (the prompt's only,
        with ``prompt_only``)."""
        self._store(request, *self._unoffered(request, seq, num_tokens))

    def _unoffered(self, request: str, seq: Sequence, num_tokens: int) -> tuple[list[int], int, int]:
        bound = min(num_tokens, seq.num_tokens, len(seq.prompt) if self.prompt_only else num_tokens)
        full, start = bound // self.bm.block_size, self.next_offer.get(request, 0)
        return (self.bm.content_hashes(seq, full)[start:full] if full > start else []), start, full

    def _store(self, request: str, keys: list[int], start: int, full: int) -> None:
        result = self.tier.prepare_store(request, keys, start) if keys else None
        if result is not None:
            self.writing += result[0]
            self.next_offer[request] = full

    def finish(self, request: str, seq: Sequence) -> None:
        """``seq`` ends (before its blocks are freed): what it computed of its prompt is offered, and the tier's
        policy takes the request's accesses as one, both at the next step's commit after its stores (as vLLM
        handles the step's ``finished_req_ids``)."""
        computed = min(seq.num_computed_tokens, max(len(seq.prompt), seq.num_tokens - 1))
        self.finished.append((request, *self._unoffered(request, seq, computed)))

    def summary(self) -> dict[str, int | str]:
        tier = self.tier
        return {
            "blocks": tier.num_blocks,
            "policy": tier.policy_name,
            "prompt_only": self.prompt_only,
            "stored_blocks": tier.stored,
            "evicted_blocks": tier.evicted,
            "loaded_blocks": tier.loaded,
            "gpu_prefix_hit_tokens": self.gpu_hit_tokens,
            "cpu_prefix_hit_tokens": self.cpu_hit_tokens,
            "reloaded_tokens": self.reloaded_tokens,
        }

"""A CPU KV tier under V1 mechanics, as vLLM's native offloading keeps one (``vllm/v1/kv_offload/cpu/``).

The tier holds copies of full GPU blocks, each named by its content hash (vLLM's offload key: the request's block
hash; one block a chunk). Its rules are vLLM 0.34's ``CPUOffloadingManager``'s, checked step by step against it
(tests/test_cpu_tier_vllm.py):

- a store offers a request's keys; keys already held are skipped (a ready one counts as the request's reuse); new
  ones take free slots, evicting through the policy if they must, never one of the offered keys; it is atomic: all
  the new keys or none (``None``, and the request offers them again the next time it runs);
- a stored chunk is write-pending (ref count -1) until its store completes, pinned (ref count > 0) while loads read
  it, evictable only at ref count 0;
- LRU ranks each request once, when it first touches the tier, and its chunks under that rank tail first (the tail
  is evicted first); when the request finishes its chunks get fresh ranks, tail first, so its head is the newest;
- ARC keeps T1 (stored once), T2 (reused), their ghosts B1 and B2, and a target size for T1 that a store of a ghost
  moves; a finished request moves what it reused from T1 to T2.

``OffloadedPrefix`` is the engine's side: what a step stores, what an admission loads (the loaded blocks are put in
the GPU prefix cache, so the admission finds them as hits), and what a request leaves when it finishes.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Literal

Policy = Literal["lru", "arc"]


class _Lru:
    """vLLM's ``LRUCachePolicy``: the smallest ``(rank, -position)`` of the evictable chunks goes first (a heap whose
    stale entries are skipped, as vLLM's)."""

    def __init__(self, capacity: int, evictable: set[int]) -> None:
        self.ranks: dict[int, tuple[int, int]] = {}
        self.request_rank: dict[str, int] = {}
        self.next_rank = 0
        self.evictable = evictable  # the tier's own set
        self.heap: list[tuple[tuple[int, int], int]] = []

    def _rank_of(self, request: str) -> int:
        if request not in self.request_rank:
            self.next_rank += 1
            self.request_rank[request] = self.next_rank
        return self.request_rank[request]

    def _rerank(self, key: int, rank: tuple[int, int]) -> None:
        self.ranks[key] = rank
        if key in self.evictable:
            heapq.heappush(self.heap, (rank, key))

    def mark_evictable(self, key: int) -> None:
        heapq.heappush(self.heap, (self.ranks[key], key))
        if len(self.heap) > max(64, 2 * len(self.evictable)):  # mostly stale: rebuilt from the live entries
            self.heap = [(self.ranks[k], k) for k in self.evictable]
            heapq.heapify(self.heap)

    def insert(self, key: int, position: int, request: str) -> None:
        self.ranks[key] = (self._rank_of(request), -position)

    def on_store_miss(self, keys: list[int]) -> None:
        return

    def on_access(self, keys: list[tuple[int, int]], request: str) -> None:
        """Keys a request sees for the first time rise to its rank (tails before heads)."""
        rank = self._rank_of(request)
        for key, position in keys:
            if key in self.ranks and self.ranks[key] < (rank, -position):
                self._rerank(key, (rank, -position))

    def on_finished(self, keys: list[int], inserted: set[int], reused: set[int], request: str) -> None:
        for key in reversed(keys):
            if key in self.ranks:
                self.next_rank += 1
                self._rerank(key, (self.next_rank, 0))
        self.request_rank.pop(request, None)

    def evict(self, n: int, evictable, protected: set[int]) -> list[int] | None:
        chosen: dict[int, None] = {}  # in the order taken
        popped = []
        while self.heap and len(chosen) < n:
            entry = heapq.heappop(self.heap)
            rank, key = entry
            if key not in evictable or self.ranks.get(key) != rank or key in chosen:
                continue  # stale
            popped.append(entry)
            if key not in protected:
                chosen[key] = None
        if len(chosen) < n:
            for entry in popped:
                heapq.heappush(self.heap, entry)
            return None
        for entry in popped:
            if entry[1] not in chosen:
                heapq.heappush(self.heap, entry)
        for key in chosen:
            del self.ranks[key]
        return list(chosen)


class _Arc:
    """vLLM's ``ARCCachePolicy``: T1 and T2 with their ghosts, T1's target moved by stores of ghosts."""

    def __init__(self, capacity: int, evictable: set[int]) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def insert(self, key: int, position: int, request: str) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_store_miss(self, keys: list[int]) -> None:
        for key in reversed(keys):
            if key in self.b1:
                self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.move_to_end(key)

    def on_access(self, keys: list[tuple[int, int]], request: str) -> None:
        return

    def mark_evictable(self, key: int) -> None:
        return

    def on_finished(self, keys: list[int], inserted: set[int], reused: set[int], request: str) -> None:
        for key in reversed(keys):
            if key in inserted:  # a store is no reuse: only its recency is restored
                for tier in (self.t1, self.t2):
                    if key in tier:
                        tier.move_to_end(key)
            elif key in reused and key in self.t1:
                del self.t1[key]
                self.t2[key] = None
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, evictable, protected: set[int]) -> list[int] | None:
        def candidates(tier):  # scanned once, LRU end first, as vLLM's monotonic scan
            return (k for k in tier if k in evictable and k not in protected)

        once, often = candidates(self.t1), candidates(self.t2)
        t1_size, chosen = len(self.t1), []
        for _ in range(n):
            key = next(once, None) if t1_size >= int(self.target) else None
            from_t1 = key is not None
            if key is None:
                key = next(often, None)
            if key is None:
                key, from_t1 = next(once, None), True
            if key is None:
                return None
            chosen.append((key, from_t1))
            t1_size -= from_t1
        for key, from_t1 in chosen:
            del (self.t1 if from_t1 else self.t2)[key]
            (self.b1 if from_t1 else self.b2)[key] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.capacity):
                ghost.popitem(last=False)
        return [key for key, _ in chosen]


class _Request:
    """What one request did to the tier: the keys it saw (by position), stored and reused."""

    __slots__ = ("positions", "inserted", "reused", "misses")

    def __init__(self) -> None:
        self.positions: dict[int, int] = {}
        self.inserted: set[int] = set()
        self.reused: set[int] = set()
        self.misses: set[int] = set()


class CpuTier:
    """The CPU pool: ``num_blocks`` slots, each holding one chunk named by its key; see the module docstring."""

    def __init__(self, num_blocks: int, policy: Policy = "lru") -> None:
        self.num_blocks = num_blocks
        self.policy_name = policy
        self.evictable: set[int] = set()
        self.policy = (_Lru if policy == "lru" else _Arc)(num_blocks, self.evictable)
        self.ref_counts: dict[int, int] = {}  # key -> -1 write pending, 0 ready, n > 0 pinned by n loads
        self.slot: dict[int, int] = {}  # key -> the CPU slot that holds it
        self._fresh = 0  # slots never used yet are handed out first, then freed ones, newest first
        self._freed: list[int] = []
        self.requests: dict[str, _Request] = {}
        self.stored = self.evicted = self.loaded = 0  # chunks, over the run

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._fresh + len(self._freed)

    def lookup(self, keys) -> int:
        """How many leading ``keys`` the tier holds, ready or still being written (vLLM counts both)."""
        n = 0
        for key in keys:
            if key not in self.ref_counts:
                break
            n += 1
        return n

    def is_ready(self, key: int) -> bool:
        return self.ref_counts.get(key, -1) >= 0

    def _seen(self, request: str, keys: list[int], first: int, inserted=(), reused=()) -> None:
        state = self.requests.setdefault(request, _Request())
        new = [(k, first + i) for i, k in enumerate(keys) if k not in state.positions]
        state.positions.update(new)
        if new:
            self.policy.on_access(new, request)
        state.inserted.update(inserted)
        state.reused.update(k for k in reused if k not in state.inserted)

    def prepare_store(self, request: str, keys: list[int], first: int) -> tuple[list[int], list[int]] | None:
        """Offer ``keys`` (those of blocks ``first``, ``first + 1``, ...): (stored, evicted), or None if the
        new ones cannot all find a slot."""
        state = self.requests.setdefault(request, _Request())
        new = [k for k in keys if k not in self.ref_counts]
        ready = [k for k in keys if self.ref_counts.get(k, -1) >= 0]
        misses = [k for k in new if k not in state.misses]
        if misses:
            self.policy.on_store_miss(misses)
            state.misses.update(misses)
        recorded = set(new) | set(ready)
        self._seen(request, [k for k in keys if k in recorded], first, reused=ready)
        if not new:
            return [], []
        short = len(new) - self.num_free
        evicted: list[int] = []
        if short > 0:
            if short > len(self.evictable):
                return None
            evicted = self.policy.evict(short, self.evictable, set(keys))
            if evicted is None:
                return None
            for key in evicted:
                self.evictable.discard(key)
                del self.ref_counts[key]
                self._freed.append(self.slot.pop(key))
            self.evicted += len(evicted)
        positions = {k: first + i for i, k in enumerate(keys)}
        for key in new:
            if self._fresh < self.num_blocks:
                self.slot[key], self._fresh = self._fresh, self._fresh + 1
            else:
                self.slot[key] = self._freed.pop()
            self.ref_counts[key] = -1
            self.policy.insert(key, positions[key], request)
        state.inserted.update(new)
        return new, evicted

    def complete_store(self, keys: list[int]) -> None:
        for key in keys:
            if self.ref_counts.get(key) == -1:
                self.ref_counts[key] = 0
                self.evictable.add(key)
                self.policy.mark_evictable(key)
                self.stored += 1

    def prepare_load(self, request: str, keys: list[int], first: int) -> list[int]:
        """Pin ready ``keys`` for a load into the GPU; their slots, in order."""
        for key in keys:
            if self.ref_counts[key] < 0:
                raise ValueError(f"chunk {key} is not ready to be loaded")
            self.evictable.discard(key)
            self.ref_counts[key] += 1
        self._seen(request, keys, first, reused=keys)
        self.loaded += len(keys)
        return [self.slot[k] for k in keys]

    def complete_load(self, keys: list[int]) -> None:
        for key in keys:
            if self.ref_counts.get(key, 0) <= 0:
                raise ValueError(f"chunk {key} is not being loaded")
            self.ref_counts[key] -= 1
            if self.ref_counts[key] == 0:
                self.evictable.add(key)
                self.policy.mark_evictable(key)

    def finish(self, request: str) -> None:
        """The request is over: the policy takes its accesses as one (LRU: its head the newest)."""
        state = self.requests.pop(request, None)
        if state is None:
            return
        keys = sorted(state.positions, key=state.positions.__getitem__)
        self.policy.on_finished(keys, state.inserted - state.reused, state.reused, request)

    def audit(self) -> list[str]:
        """Every broken invariant of the pool, as readable lines."""
        problems = []
        if len(set(self.slot.values())) != len(self.slot) or set(self.slot.values()) & set(self._freed):
            problems.append("a CPU slot holds two chunks")
        if self.slot.keys() != self.ref_counts.keys() or len(self.slot) > self.num_blocks:
            problems.append(f"{len(self.slot)} chunks named, {len(self.ref_counts)} counted, {self.num_blocks} slots")
        if len(self.slot) + self.num_free != self.num_blocks:
            problems.append(f"{len(self.slot)} held + {self.num_free} free != {self.num_blocks} CPU slots")
        if self.evictable != {k for k, n in self.ref_counts.items() if n == 0}:
            problems.append("the evictable chunks are not exactly those at ref count 0")
        if any(n < -1 for n in self.ref_counts.values()):
            problems.append("a CPU chunk has a ref count below -1")
        return problems

"""Real English prompts for runs on a real model (the benchmark and ``engine run --executor hf``).

Tasks × subjects give varied prompts; every fourth one carries a context paragraph so prompt
lengths spread from about ten to over a hundred tokens. Two disjoint sets: ``benchmark_prompts``
and ``holdout_prompts`` (a different workload for checking a fitted cost profile).
"""

from __future__ import annotations

TASKS = (
    "Write a haiku about {}.",
    "Explain {} to a ten-year-old.",
    "Give three practical tips about {}.",
    "Summarize the history of {} in two sentences.",
    "What are the pros and cons of {}?",
    "Write the opening paragraph of a short story about {}.",
    "List five surprising facts about {}.",
    "Describe {} in one paragraph for a travel guide.",
)

SUBJECTS = (
    "queues at the post office",
    "the moon landing",
    "sourdough bread",
    "electric bicycles",
    "the printing press",
    "coral reefs",
    "learning a second language",
    "lighthouses",
    "chess openings",
    "city gardens",
    "the water cycle",
    "public libraries",
    "volcanoes",
    "jazz music",
    "paper airplanes",
    "winter camping",
)

CONTEXT = (
    "Context: a scheduler decides which requests run in each step of a language model server. "
    "It keeps a waiting queue, a running queue and a swapped queue, and it must fit every running "
    "sequence's key-value cache into a fixed number of memory blocks. When memory runs out it "
    "preempts the newest request, either by swapping its blocks to CPU memory or by dropping them "
    "and recomputing later. With that in mind: "
)


def all_prompts() -> list[str]:
    out = []
    for i, subject in enumerate(SUBJECTS):
        for j, task in enumerate(TASKS):
            text = task.format(subject)
            if (i + j) % 4 == 0:
                text = CONTEXT + text
            out.append(text)
    return out


def benchmark_prompts(n: int = 64) -> list[str]:
    """The first ``n`` (at most 64) prompts of the interleaved list: even positions."""
    return all_prompts()[0::2][:n]


def holdout_prompts(n: int = 32) -> list[str]:
    """Prompts disjoint from ``benchmark_prompts``: odd positions."""
    return all_prompts()[1::2][:n]

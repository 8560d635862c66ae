"""Per-step time series of a run: queues, batch, tokens, KV blocks and swaps, one row per step.

An ``on_step`` observer that appends to plain column lists (cheap enough to leave on for every
run: a few appends per step) and turns them into a table at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.core.report import StepReport

COLUMNS = (
    "step", "time_s", "duration_s", "num_waiting", "num_running", "num_swapped",
    "batch_groups", "batch_seqs", "prefill_groups", "prefill_tokens", "decode_seqs", "kv_tokens_read",
    "gpu_blocks_used", "cpu_blocks_used", "blocks_swapped_in", "blocks_swapped_out", "blocks_copied",
    "preempted_recompute", "preempted_swap", "finished",
)


class TimeSeriesRecorder:
    """Collects one row per engine step; ``frame()`` gives them as a DataFrame."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {c: [] for c in COLUMNS}
        self._append = [self.columns[c].append for c in COLUMNS]

    def __call__(self, r: StepReport) -> None:
        out = r.output
        f = r.features if r.features is not None else out.features
        cache = r.cache
        prefill_groups = out.num_prefill_groups
        swap_preempt = 0
        for _g, mode in out.preempted:
            if mode.value == "swap":
                swap_preempt += 1
        values = (
            r.step, r.now, r.duration, r.num_waiting, r.num_running, r.num_swapped,
            len(out.scheduled), f.decode_seqs + prefill_groups, prefill_groups, f.prefill_tokens, f.decode_seqs,
            f.kv_tokens_read, cache.num_gpu_blocks - cache.num_free_gpu_blocks,
            cache.num_cpu_blocks - cache.num_free_cpu_blocks, len(out.blocks_to_swap_in), len(out.blocks_to_swap_out),
            len(out.blocks_to_copy), len(out.preempted) - swap_preempt, swap_preempt, len(r.finished),
        )
        for append, v in zip(self._append, values):
            append(v)

    def __len__(self) -> int:
        return len(self.columns["step"])

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.columns, columns=list(COLUMNS))

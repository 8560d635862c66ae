"""Per-step time series of a run: queues, batch, tokens, KV blocks and swaps, one row per step.

An ``on_step`` observer cheap enough to leave on for every run (one tuple per step). The rows
stay in memory, or, given a path, go to a Parquet file a row group at a time (a million-request
run has millions of steps). Either way the figures of the summary's ``kv_usage`` (peaks and
time-weighted means) are accumulated row group by row group, in step order, so a streamed run
never needs its rows back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kvsched.metrics.parquet_rows import ParquetRows
from kvsched.metrics.requests import ordered_sum

if TYPE_CHECKING:
    import pandas as pd

    from kvsched.core.report import StepReport

COLUMNS = (
    "step",
    "time_s",
    "duration_s",
    "start_s",
    "num_waiting",
    "num_running",
    "num_swapped",
    "batch_groups",
    "batch_seqs",
    "prefill_groups",
    "prefill_tokens",
    "decode_seqs",
    "kv_tokens_read",
    "gpu_blocks_used",
    "cpu_blocks_used",
    "blocks_swapped_in",
    "blocks_swapped_out",
    "blocks_copied",
    "preempted_recompute",
    "preempted_swap",
    "finished",
)
SCHEMA = pa.schema([(c, pa.float64() if c in ("time_s", "duration_s", "start_s") else pa.int64()) for c in COLUMNS])
_DTYPES = {f.name: f.type.to_pandas_dtype() for f in SCHEMA}  # numpy reads a column of Python numbers faster than Arrow


class TimeSeriesRecorder:
    """One row per engine step, kept (``path=None``) or streamed to ``path`` (then call ``close()``).

    Rows are kept as columns (a steady run's steps arrive as lists, one per column: they are
    appended as they are); a step's row waits as a tuple until the next run or the next write."""

    def __init__(self, path: Path | None = None, row_group_size: int = 65_536) -> None:
        self.file = ParquetRows(path, SCHEMA, on_write=self._tally, dictionary=False) if path is not None else None
        self.row_group_size = row_group_size
        self._columns: list[list] = [[] for _ in COLUMNS]  # kept rows (all of them, without a path)
        self._rows: list[tuple] = []  # rows of single steps, not yet in the columns
        self._peaks = {"gpu_blocks_used": 0, "cpu_blocks_used": 0, "num_waiting": 0}
        # time-weighted sums, added step by step in order (as sum() over the columns would add them)
        self._sums = {"duration_s": 0.0, "gpu_blocks_used": 0.0, "batch_seqs": 0.0}
        self._tallied = self.file is not None  # a kept series is tallied once, when asked

    def __call__(self, r: StepReport) -> None:
        out = r.output
        f = r.features if r.features is not None else out.features
        cache = r.cache
        prefill_groups = out.num_prefill_groups
        swap_preempt = 0
        for victim in out.preempted:
            if victim.mode.value == "swap":
                swap_preempt += 1
        self._rows.append(
            (
                r.step,
                r.now,
                r.duration,
                r.now - r.duration if r.started is None else r.started,
                r.num_waiting,
                r.num_running,
                r.num_swapped,
                len(out.scheduled),
                f.decode_seqs + prefill_groups,
                prefill_groups,
                f.prefill_tokens,
                f.decode_seqs,
                f.kv_tokens_read,
                cache.num_gpu_blocks - cache.num_free_gpu_blocks,
                cache.num_cpu_blocks - cache.num_free_cpu_blocks,
                len(out.blocks_to_swap_in),
                len(out.blocks_to_swap_out),
                len(out.blocks_to_copy),
                len(out.preempted) - swap_preempt,
                swap_preempt,
                len(r.finished),
            )
        )
        if self.file is not None and len(self._rows) >= 1024:
            self._settle()

    def on_steps(self, run) -> None:
        """A steady run's rows (``StepRun``, kvsched.executors.steady_runs), as its steps' reports would give them
        (plain decodes: no prefill, block move or preemption)."""
        self._settle(flush=False)
        k, n, cache, gpu = len(run.duration), len(run.output.scheduled), run.cache, run.cache.num_gpu_blocks
        (
            step,
            time_s,
            duration,
            start,
            waiting,
            running,
            swapped,
            groups,
            seqs,
            prefill_groups,
            prefill_tokens,
            decodes,
            kv,
            gpu_used,
            cpu_used,
            *moves,
            finished,
        ) = self._columns
        step += range(run.first, run.first + k)
        time_s += run.now
        duration += run.duration
        start += run.started
        waiting += run.num_waiting
        running += run.num_running
        kv += run.kv_tokens_read
        gpu_used += [gpu - free for free in run.free_gpu_blocks]
        swapped += [run.num_swapped] * k
        cpu_used += [cache.num_cpu_blocks - cache.num_free_cpu_blocks] * k
        zeros, ns = [0] * k, [n] * k
        for column in (prefill_groups, prefill_tokens, *moves, finished):
            column += zeros
        for column in (groups, seqs, decodes):
            column += ns
        finished[-1] = len(run.finished)
        self._settle()

    def _settle(self, flush: bool = True) -> None:
        """Move the single steps' rows into the columns; streaming, write a row group once there are enough."""
        if self._rows:
            for column, values in zip(self._columns, zip(*self._rows)):
                column += values
            self._rows = []
        if flush and self.file is not None and len(self._columns[0]) >= self.row_group_size:
            self._write()

    def _table(self) -> pa.Table:
        self._settle(flush=False)
        return pa.Table.from_arrays(
            [pa.array(np.fromiter(c, _DTYPES[f.name], len(c))) for c, f in zip(self._columns, SCHEMA)], schema=SCHEMA
        )

    def _write(self) -> None:
        table = self._table()
        if table.num_rows:
            self.file.write(table)
        self._columns = [[] for _ in COLUMNS]

    def _tally(self, table: pa.Table) -> None:
        """Fold the next rows (in step order) into the peaks and the time-weighted sums."""
        if not table.num_rows:
            return
        for name in self._peaks:
            self._peaks[name] = max(self._peaks[name], int(np.max(table.column(name).to_numpy())))
        duration = table.column("duration_s").to_numpy()
        for name in self._sums:
            weighted = duration if name == "duration_s" else table.column(name).to_numpy() * duration
            self._sums[name] = ordered_sum(np.concatenate(([self._sums[name]], weighted)))

    def __len__(self) -> int:
        return (self.file.num_rows if self.file is not None else 0) + len(self._columns[0]) + len(self._rows)

    def kv_usage(self, total_gpu_blocks: int) -> dict:
        """The summary's ``kv_usage``: peaks and time-weighted means over the run (after ``close()`` if streamed)."""
        if not self._tallied:
            self._tally(self._table())
            self._tallied = True
        peaks, sums = self._peaks, self._sums
        t = sums["duration_s"]
        return {
            "gpu_blocks_total": total_gpu_blocks,
            "gpu_blocks_peak": peaks["gpu_blocks_used"],
            "gpu_utilization_mean": (sums["gpu_blocks_used"] / t if t > 0 else 0.0) / total_gpu_blocks,
            "cpu_blocks_peak": peaks["cpu_blocks_used"],
            "batch_seqs_mean": sums["batch_seqs"] / t if t > 0 else 0.0,
            "waiting_peak": peaks["num_waiting"],
        }

    def close(self) -> None:
        """A streaming recorder: write the last rows and name the file."""
        if self.file is not None:
            self._write()
            self.file.close()

    def frame(self) -> pd.DataFrame:
        if self.file is not None:
            import pandas as pd

            return pd.read_parquet(self.file.path)
        return self._table().to_pandas()


def step_starts(steps: pd.DataFrame) -> np.ndarray:
    """When each step of a time series began: the engine's own clock (``start_s``), so that a request
    arriving at that instant is placed as the engine placed it; end minus duration for older files."""
    if "start_s" in steps:
        return steps.start_s.to_numpy()
    return (steps.time_s - steps.duration_s).to_numpy()

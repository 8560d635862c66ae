"""Fit a cost profile from measured steps, so the simulator's clock follows a real executor.

Record a run with ``StepRecorder`` (an ``on_step`` observer: the step's features plus the
duration the executor reported), save it as CSV, and fit ``t = a + b·P + c·D + d·K + e·E`` with
``fit_profile`` (E: the prefill chunks' query-key pairs; a CSV written before that column, or steps
without pairs, fit e = 0). The fit minimises *relative* error, because step times span two orders
of magnitude and an ordinary least-squares fit would serve only the long prefill steps; the
coefficients are constrained to be non-negative (exact NNLS: with five unknowns every active set
can be tried).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from kvsched.core.request import MAX_TOKENS
from kvsched.errors import KvschedError, quote
from kvsched.executors.cost_model import MAX_MS, CostProfile
from kvsched.userfiles.reader import text_lines

if TYPE_CHECKING:
    from kvsched.core.report import StepReport

TERMS = ("base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms", "attention_pair_ms")


class CalibrationError(KvschedError):
    """A recorded run cannot be read or does not determine a profile."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One measured step: the cost model's features and the time it really took."""

    prefill_tokens: int
    decode_seqs: int
    kv_tokens_read: int
    blocks_swapped: int
    blocks_copied: int
    duration_s: float
    prefill_pairs: int = 0  # last, so that records and files without it still read (none counted)

    @property
    def moves_blocks(self) -> bool:
        return bool(self.blocks_swapped or self.blocks_copied)

    def row(self) -> tuple[float, float, float, float, float]:
        return (
            1.0,
            float(self.prefill_tokens),
            float(self.decode_seqs),
            float(self.kv_tokens_read),
            float(self.prefill_pairs),
        )


COLUMNS = tuple(f.name for f in fields(StepRecord))
OPTIONAL = {"prefill_pairs"}  # a file recorded before the column: each step's pairs are 0


class StepRecorder:
    """``on_step`` observer that keeps a ``StepRecord`` for every step that computed something.

    Pass it as ``engine.run(requests, on_step=recorder)``. ``skip`` drops the first steps
    (warm-up: the first real forward passes are slow for reasons a step model cannot capture).
    """

    def __init__(self, skip: int = 0) -> None:
        self.skip = skip
        self.records: list[StepRecord] = []
        self._seen = 0

    def __call__(self, report: StepReport) -> None:
        f = report.features if report.features is not None else report.output.features
        if not (f.prefill_tokens or f.decode_seqs):
            return
        self._seen += 1
        if self._seen <= self.skip:
            return
        self.records.append(
            StepRecord(
                f.prefill_tokens,
                f.decode_seqs,
                f.kv_tokens_read,
                f.blocks_swapped,
                f.blocks_copied,
                report.duration,
                f.prefill_pairs,
            )
        )

    def save(self, path: Path) -> Path:
        return save_records(self.records, path)


def save_records(records: Iterable[StepRecord], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(astuple(r) for r in records)
    return path


def load_records(path: Path) -> list[StepRecord]:
    """Read a recorded run; a bad cell raises ``CalibrationError`` naming file, line and column."""
    path = Path(path)
    reader = csv.reader(text_lines(path, "recorded run"))  # a line that is not UTF-8: a FileError naming it
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header and c not in OPTIONAL]
    if missing:
        raise CalibrationError(f"{path}:1: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
    index = {c: header.index(c) for c in COLUMNS if c in header}
    out = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        values = []
        for col in index:
            cell = row[index[col]].strip() if index[col] < len(row) else ""
            try:
                value = float(cell) if col == "duration_s" else int(cell)
            except ValueError:
                kind = "a number" if col == "duration_s" else "an integer"
                raise CalibrationError(f"{path}:{line}: column {col!r}: not {kind}: {cell!r}") from None
            if value < 0 or (col == "duration_s" and not math.isfinite(value)):
                raise CalibrationError(f"{path}:{line}: column {col!r}: must be a finite value >= 0, got {cell!r}")
            values.append(value)
        out.append(StepRecord(*values))
    return out


def _lstsq(
    rows: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float], active: tuple[int, ...]
) -> list[float] | None:
    """Weighted least squares restricted to the ``active`` terms (normal equations, Gaussian elimination)."""
    k = len(active)
    ata = [[0.0] * k for _ in range(k)]
    atb = [0.0] * k
    for row, t, w in zip(rows, targets, weights):
        x = [row[i] * w for i in active]
        tw = t * w
        for i in range(k):
            atb[i] += x[i] * tw
            for j in range(i, k):
                ata[i][j] += x[i] * x[j]
    for i in range(k):
        for j in range(i):
            ata[i][j] = ata[j][i]
    # Scale columns so that tokens (~1e3) and the constant (1) are comparable before eliminating.
    scale = [math.sqrt(ata[i][i]) or 1.0 for i in range(k)]
    m = [[ata[i][j] / (scale[i] * scale[j]) for j in range(k)] + [atb[i] / scale[i]] for i in range(k)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(k):
            if r != col:
                factor = m[r][col] / m[col][col]
                for c in range(col, k + 1):
                    m[r][c] -= factor * m[col][c]
    return [m[i][k] / m[i][i] / scale[i] for i in range(k)]


def _check_bounds(records: Sequence[StepRecord]) -> None:
    """Every measured step within what a profile can model (a step's time at most MAX_MS, its counts at
    most a step's: MAX_TOKENS tokens and sequences, MAX_TOKENS² KV tokens or pairs), so that the fit's
    sums of squares stay finite."""
    for i, r in enumerate(records, start=1):
        if not 0 <= r.duration_s <= MAX_MS / 1000:
            raise CalibrationError(
                f"recorded step {i:,}: a duration of {r.duration_s:.6g} s is beyond any profile "
                f"(a finite value from 0 to {MAX_MS / 1000:,.0f} s)"
            )
        if (
            max(r.prefill_tokens, r.decode_seqs, r.kv_tokens_read // MAX_TOKENS, r.prefill_pairs // MAX_TOKENS)
            > MAX_TOKENS
        ):
            raise CalibrationError(
                f"recorded step {i:,}: more tokens or sequences than any step holds (at most "
                f"{MAX_TOKENS:,} each, {MAX_TOKENS**2:,} KV tokens read or query-key pairs)"
            )


def fit_coefficients(records: Sequence[StepRecord], relative: bool = True) -> tuple[float, ...]:
    """Non-negative (a, b, c, d, e) in ms minimising the squared (relative) error over steps without block moves;
    a term no step exercises (e without pairs) is 0."""
    _check_bounds(records)
    usable = [r for r in records if not r.moves_blocks and r.duration_s > 0]
    if len(usable) < 4:  # the four terms every run exercises
        raise CalibrationError(f"need at least 4 measured steps without swaps or copies, got {len(usable)}")
    rows = [r.row() for r in usable]
    targets = [r.duration_s * 1000.0 for r in usable]
    weights = [1.0 / t if relative else 1.0 for t in targets]
    best: tuple[float, list[float]] | None = None
    for size in range(len(TERMS), 0, -1):
        for active in itertools.combinations(range(len(TERMS)), size):
            sol = _lstsq(rows, targets, weights, active)
            if sol is None or any(v < 0 for v in sol):
                continue
            coef = [0.0] * len(TERMS)
            for i, v in zip(active, sol):
                coef[i] = v
            loss = sum(
                ((sum(c * x for c, x in zip(coef, row)) - t) * w) ** 2 for row, t, w in zip(rows, targets, weights)
            )
            if best is None or loss < best[0]:
                best = (loss, coef)
    if best is None:
        raise CalibrationError("the recorded steps do not determine a non-negative profile")
    return tuple(best[1])


def fit_profile(
    records: Sequence[StepRecord],
    name: str,
    *,
    description: str = "",
    kv_bytes_per_token: int = 0,
    swap_gb_per_s: float = 16.0,
    copy_gb_per_s: float = 100.0,
    relative: bool = True,
) -> CostProfile:
    """A ``CostProfile`` fitted to ``records``; block-move bandwidths are taken as given."""
    coef = fit_coefficients(records, relative)
    errors = fit_errors_of(records, coef)
    text = description or f"fitted to {errors['n']} measured steps"
    text += f" (mean error {errors['mape'] * 100:.1f}%, p95 {errors['p95'] * 100:.1f}%)"
    try:
        return CostProfile(
            name=name,
            description=text,
            **dict(zip(TERMS, coef)),
            kv_bytes_per_token=kv_bytes_per_token,
            swap_gb_per_s=swap_gb_per_s,
            copy_gb_per_s=copy_gb_per_s,
        )
    except ValidationError as exc:  # a coefficient past the profile's bounds (MAX_MS), or a bandwidth given out of them
        first = exc.errors()[0]
        raise CalibrationError(
            f"the fitted profile is invalid: {'.'.join(map(str, first['loc']))}: {first['msg']}"
            f" (got {quote(first.get('input'))})"
        ) from None


def fit_errors_of(records: Sequence[StepRecord], coef: Sequence[float]) -> dict[str, float]:
    """Relative error of the linear prediction: mean (MAPE), p95 and max, over steps without block moves."""
    errs = sorted(
        abs(sum(k * x for k, x in zip(coef, r.row())) - r.duration_s * 1000.0) / (r.duration_s * 1000.0)
        for r in records
        if not r.moves_blocks and r.duration_s > 0
    )
    if not errs:
        return {"n": 0, "mape": float("nan"), "p95": float("nan"), "max": float("nan")}
    return {
        "n": len(errs),
        "mape": sum(errs) / len(errs),
        "p95": errs[min(len(errs) - 1, math.ceil(0.95 * len(errs)) - 1)],
        "max": errs[-1],
    }


def fit_errors(profile: CostProfile, records: Sequence[StepRecord]) -> dict[str, float]:
    return fit_errors_of(records, [getattr(profile, term) for term in TERMS])

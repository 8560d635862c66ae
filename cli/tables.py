"""The tables ``engine`` commands print their results in: a run's summary, plain and ranked tables."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvsched.cli.common import console


def print_summary(summary: dict) -> None:
    """The summary table, the SLO goodput when a target was given, then the run's warnings."""
    from kvsched.metrics.classes import class_table
    from kvsched.metrics.warnings import warning_text

    console.print(summary_table(summary))
    head, rows = class_table(summary)
    if rows:  # per SLO class, tenant, priority and over sessions (metrics/classes.py)
        print_table("per class", head, rows)
    slo = summary.get("slo")
    if slo:
        console.print(
            f"SLO goodput: {slo['goodput_requests_per_s']:.3f} req/s ({100 * slo['slo_attainment']:.1f}% of requests)"
        )
    if summary.get("length_predictor"):
        console.print(
            f"output lengths: the policy predicts them with {escape(summary['length_predictor'])}"
            + (" (it knows the workload's true lengths)" if "oracle" in summary["length_predictor"] else ""),
            highlight=False,
        )
    if summary.get("defaults"):
        console.print(
            f"settings filled in: {escape(defaults_text(summary['defaults']))}", highlight=False, soft_wrap=True
        )
    for warning in summary.get("warnings") or ():
        console.print(
            f"[bold yellow]warning:[/] {escape(warning_text(warning, summary['num_requests']))}",
            highlight=False,
            soft_wrap=True,
        )


def print_table(title: str, head: list[str], rows: list[list[str]]) -> None:
    """A table of text: its first column (what each row is) to the left, the numbers to the right."""
    table = Table(title=title)
    for i, name in enumerate(head):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_ranked(title: str, head: list[str], rows: list[list[str]], baseline: str) -> None:
    """A ranked table (compare's, capacity's) and what its intervals, changes and ranks mean."""
    from kvsched.experiments.evidence import statistics_note

    print_table(title, head, rows)
    console.print(f"baseline {baseline}. {statistics_note()}", highlight=False, soft_wrap=True)


def defaults_text(defaults: dict[str, dict]) -> str:
    """``summary.json``'s ``defaults`` as one line: each setting the run filled, grouped by where it came from."""
    by_source: dict[str, list[str]] = {}
    for name, filled in defaults.items():
        by_source.setdefault(filled["from"], []).append(f"{name}={filled['value']}")
    return "; ".join(f"{', '.join(names)} ({source})" for source, names in by_source.items())


def summary_table(summary: dict) -> Table:
    fleet = summary.get("fleet")
    who = (
        f"router {fleet['router']} · {fleet['replicas']} replicas of {summary['policy']}"
        if fleet
        else f"policy {summary['policy']}"
    )
    table = Table(title=f"{who} · profile {summary.get('profile', '?')}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "requests (finished / ignored / aborted)",
        f"{summary['finished']} / {summary['ignored']} / {summary['aborted']}",
    )
    simulated = "server" not in summary and summary.get("executor", "sim") == "sim"  # a real run takes wall time
    table.add_row("simulated duration" if simulated else "wall duration", f"{summary['duration_s']:.1f} s")
    table.add_row(
        "throughput", f"{summary['requests_per_s']:.2f} req/s · {summary['throughput_tokens_per_s']:.0f} tok/s"
    )
    for key, label, scale, unit in (
        ("ttft_s", "TTFT", 1, "s"),
        ("tpot_s", "TPOT", 1000, "ms"),
        ("e2e_s", "end-to-end", 1, "s"),
    ):
        d = summary[key]
        if d["mean"] is None:
            table.add_row(label, "-")
        else:
            table.add_row(
                f"{label} mean / p50 / p99",
                " / ".join(f"{d[k] * scale:.3g}" for k in ("mean", "p50", "p99")) + f" {unit}",
            )
    if summary.get("itl_s") and summary["itl_s"]["mean"] is not None:
        d = summary["itl_s"]
        table.add_row("ITL mean / p50 / p99", " / ".join(f"{d[k] * 1000:.3g}" for k in ("mean", "p50", "p99")) + " ms")
    p = summary["preemptions"]
    if p is not None:  # a client-side measurement cannot see inside the engine
        table.add_row("preemptions (recompute / swap)", f"{p['recompute']} / {p['swap']}")
        if summary.get("recompute"):  # the recompute tax (metrics/recompute.py)
            t = summary["recompute"]
            table.add_row(
                "recompute tax",
                f"{100 * t['tax']:.1f} % ({t['recomputed_tokens']:,} of {t['computed_tokens']:,} tokens)",
            )
        table.add_row("blocks swapped (in / out)", f"{summary['blocks_swapped_in']} / {summary['blocks_swapped_out']}")
        if summary.get("cpu_tier"):  # vLLM's native offloading (allocators/offloading.py)
            c = summary["cpu_tier"]
            table.add_row(
                "prefix hits (GPU / CPU tier)",
                f"{c['gpu_prefix_hit_tokens']:,} / {c['cpu_prefix_hit_tokens']:,} tokens",
            )
            table.add_row(
                "redone after preemption (reloaded / recomputed)",
                f"{c['reloaded_tokens']:,} / {c['recomputed_tokens']:,} tokens",
            )
            table.add_row(
                "CPU tier blocks (stored / evicted / loaded)",
                f"{c['stored_blocks']:,} / {c['evicted_blocks']:,} / {c['loaded_blocks']:,} of {c['blocks']:,} "
                f"({c['policy']})",
            )
        table.add_row("leaked blocks", str(summary["leaked_blocks"]))
    return table

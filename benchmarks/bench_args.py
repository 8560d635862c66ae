"""Command-line types the benchmark scripts share."""

from __future__ import annotations

import argparse


def bounded(kind: type, low: float, high: float):
    """An argparse type: a number of ``kind`` from ``low`` to ``high`` (a count a run could never finish is a usage
    error)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:  # NaN fails too
            raise argparse.ArgumentTypeError(f"must be from {low:,} to {high:,}, got {text}")
        return value

    return parse

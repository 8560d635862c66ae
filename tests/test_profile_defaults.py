"""Defaults that fit the model: a simulated job takes its unset engine settings from what its cost profile models."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.core.config import EngineConfig
from kvsched.executors.cost_model import GIB, LLAMA2_7B_A100, SMOLLM2_135M_CPU, CostProfile, KvMemory
from kvsched.executors.settings import fit_to_profile
from kvsched.policies.sarathi import Sarathi
from kvsched.policies.vllm_default import VllmDefault
from kvsched.policies.vllm_v1 import VllmV1
from kvsched.workloads import builtin_path

ENGINE = str(Path(sys.executable).parent / "engine")


def test_a_profile_carries_its_context_and_a_kv_capacity_computed_as_vllm_does():
    assert LLAMA2_7B_A100.max_model_len == 4096 and SMOLLM2_135M_CPU.max_model_len == 8192
    memory = LLAMA2_7B_A100.kv_memory
    left = memory.device_gib * memory.gpu_memory_utilization - memory.weights_gib - memory.activations_gib
    assert (
        memory.gpu_memory_utilization == 0.9 and 55 < left < 60
    )  # GiB: what vLLM leaves an A100-80GB running Llama-2-7B
    block_bytes = 16 * 2 * 32 * 4096 * 2  # 16 tokens of K and V, 32 layers, 4096 wide, fp16
    assert LLAMA2_7B_A100.num_kv_blocks(16) == int(left * GIB // block_bytes) == 7319
    assert LLAMA2_7B_A100.num_kv_blocks(32) == 7319 // 2
    assert SMOLLM2_135M_CPU.num_kv_blocks(16) is None  # the real executor's cache is what it is given
    with pytest.raises(ValueError, match="no memory for the KV cache"):
        KvMemory(device_gib=16, weights_gib=14, activations_gib=1)


def test_unset_settings_come_from_the_profile_as_vllm_v0_sets_them():
    config = fit_to_profile(EngineConfig(), LLAMA2_7B_A100, VllmDefault)
    assert (config.max_model_len, config.num_gpu_blocks, config.max_num_batched_tokens) == (4096, 7319, 4096)
    assert config.num_cpu_blocks == EngineConfig().num_cpu_blocks
    assert fit_to_profile(EngineConfig(), SMOLLM2_135M_CPU, VllmDefault).max_num_batched_tokens == 8192
    # the budget follows an explicit max_model_len, and never falls under 2048
    assert fit_to_profile(EngineConfig(max_model_len=1024), LLAMA2_7B_A100, VllmDefault).max_num_batched_tokens == 2048
    assert fit_to_profile(EngineConfig(max_model_len=8192), LLAMA2_7B_A100, VllmDefault).max_num_batched_tokens == 8192
    assert fit_to_profile(EngineConfig(block_size=32), LLAMA2_7B_A100, VllmDefault).num_gpu_blocks == 3659


def test_a_chunked_policy_keeps_its_budget_and_is_not_limited_by_it():
    for policy in (Sarathi, VllmV1):
        config = fit_to_profile(EngineConfig(), LLAMA2_7B_A100, policy)
        assert (config.max_model_len, config.max_num_batched_tokens) == (4096, 2048), policy
        small = fit_to_profile(EngineConfig(max_num_batched_tokens=512), LLAMA2_7B_A100, policy)
        assert (small.max_model_len, small.max_num_batched_tokens) == (4096, 512)


def test_explicit_settings_and_a_policys_engine_defaults_win():
    given = EngineConfig(num_gpu_blocks=300, max_num_batched_tokens=512, max_model_len=2048)
    assert fit_to_profile(given, LLAMA2_7B_A100, VllmDefault) is given

    class PinsItsLength:
        engine_defaults = {"max_model_len": 1000}

    config = fit_to_profile(EngineConfig(), LLAMA2_7B_A100, PinsItsLength)
    assert config.max_model_len is None and "max_model_len" not in config.model_fields_set

    class PinsALongContext:
        engine_defaults = {"max_model_len": 8192}

    assert (
        fit_to_profile(EngineConfig(), LLAMA2_7B_A100, PinsALongContext).max_num_batched_tokens == 8192
    )  # its length fits a step
    unknown = CostProfile(
        name="fitted",
        base_ms=1,
        prefill_token_ms=0,
        decode_seq_ms=0,
        kv_token_ms=0,
        kv_bytes_per_token=0,
        swap_gb_per_s=1,
        copy_gb_per_s=1,
    )  # what engine calibrate writes
    plain = EngineConfig()
    assert fit_to_profile(plain, unknown, VllmDefault) is plain


def test_engine_run_on_azure_ignores_only_what_the_model_cannot_take_and_says_how_many(tmp_path):
    with builtin_path("azure-conv").open() as f:
        rows = list(csv.DictReader(f))
    too_long = sum(int(r["ContextTokens"]) > 4096 for r in rows)
    proc = subprocess.run(
        [ENGINE, "run", "--workload", "azure-conv", "-q", "--no-decision-log", "--output", tmp_path],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ignored"] == too_long and 0 < too_long < 0.03 * len(rows)
    assert summary["config"]["max_model_len"] == 4096 and summary["config"]["num_gpu_blocks"] == 7319
    (ignored,) = [w for w in summary["warnings"] if w["reason"].startswith("ignored")]
    assert ignored["count"] == too_long and "exceed max_model_len (4096)" in ignored["reason"]
    assert f"warning: {too_long} of {len(rows):,} requests ignored: " in proc.stdout

"""The roofline cost model: each term against a roofline computed by hand from the model's config and
the GPU's datasheet, the KV cache vLLM would size, and the errors a bad config gets."""

from __future__ import annotations

import json

import pytest

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.request import Request, SamplingParams
from kvsched.executors.cost_model import GIB
from kvsched.executors.hardware import Efficiency, HardwareError, load_hardware
from kvsched.executors.model_config import ModelConfigError, load_model_shape, model_shape, shipped_models
from kvsched.executors.profiles import ProfileError, roofline_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.executors.step_work import attention_work, pairs, read

H100 = dict(peak=989.4e12, fp8=1978.9e12, hbm=3.35e12, link=450e9)
E = Efficiency(
    flops_share=0.5,
    attention_flops_share=0.25,
    bandwidth_share=0.8,
    allreduce_us=8.0,
    step_ms=1.5,
    layer_us=20.0,
    request_us=30.0,
    api_ms=0.0,
    response_ms=0.0,
)


def profile(model: str, tp: int = 1, dtype: str | None = None, **kw):
    gpu = load_hardware("h100-sxm").model_copy(update={"efficiency": E})
    return roofline_profile(gpu, model, tp, dtype, **kw)


def overheads(layers: int, requests: int) -> float:
    return 1.5e-3 + layers * 20e-6 + requests * 30e-6


def test_llama2_7b_decode_is_a_read_of_every_weight_and_the_kv_cache():
    # Llama-2-7B: 32 layers, hidden 4096, 32 heads of 128 (no GQA), MLP 11008, vocab 32000, fp16
    p = profile("llama-2-7b")
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    bw = H100["hbm"] * 0.8
    weights = 32 * layer * 2 / bw  # memory-bound: one token is far below the ridge
    lm_head = 32000 * 4096 * 2 / bw
    kv = 32 * (2 * 32 * 128 * 2) * (100 + 1) / bw  # K and V of 32 heads, fp16, its 100 tokens of context and its own
    expected = weights + lm_head + kv + overheads(32, 1)
    assert p.decode_seconds(1)(100) == pytest.approx(expected, rel=1e-12)


def test_a_long_prefill_is_compute_bound_with_its_causal_attention():
    p = profile("llama-2-7b")
    t = 2048
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
    gemm = 2 * t * 32 * layer / (H100["peak"] * 0.5)
    assert gemm > 32 * layer * 2 / (H100["hbm"] * 0.8)  # past the ridge
    lm_head = max(2 * 32000 * 4096 / (H100["peak"] * 0.5), 32000 * 4096 * 2 / (H100["hbm"] * 0.8))
    pair_flops = 4 * 32 * 128  # QK^T and PV, per query-key pair and layer
    attention = 32 * max(
        t * (t + 1) // 2 * pair_flops / (H100["peak"] * 0.25), t * 2 * 32 * 128 * 2 / (H100["hbm"] * 0.8)
    )
    expected = gemm + lm_head + attention + overheads(32, 1)
    assert p.seconds(t, 0, 0, 0, 0, 16) == pytest.approx(expected, rel=1e-12)


def test_the_crossover_is_where_the_tokens_make_the_gemms_compute_bound():
    p = profile("llama-2-7b")
    ridge = H100["peak"] * 0.5 * 2 / (2 * H100["hbm"] * 0.8)  # tokens where 2·T·W / F = 2·W / B (2 bytes a weight)
    step = lambda t: p.seconds(t, 0, 0, 0, 0, 16)  # noqa: E731
    below, above = int(ridge * 0.5), int(ridge * 2)
    flat = step(below + 10) - step(below)  # only attention (tiny) grows: the weights are read once either way
    steep = step(above + 10) - step(above)
    assert steep > 20 * flat
    assert steep == pytest.approx(10 * 2 * 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) / (H100["peak"] * 0.5), rel=0.05)


def test_moe_reads_the_experts_its_tokens_activate():
    p = profile("mixtral-8x7b", tp=2)
    bw, link = H100["hbm"] * 0.8, H100["link"] * 0.8
    expert = 32 * (3 * 4096 * 14336 // 2) * 2  # one expert in each of 32 layers, this GPU's half, bf16
    # One token reads 2 of the 8 experts, two tokens 8·(1 − (6/8)²) = 3.5 (routed uniformly); the rest of the
    # second token's cost: its KV (4 of 8 KV heads here), its all-reduced activations, its request's overhead.
    rest = 32 * (2 * 4 * 128 * 2) / bw + 2 * 32 * (2 * (1 / 2) * 4096 * 2) / link + 30e-6  # TP 2: one GPU to wait on
    assert p.decode_seconds(2)(0) - p.decode_seconds(1)(0) == pytest.approx(1.5 * expert / bw + rest, rel=1e-9)
    many = p.decode_seconds(128)(0) - p.decode_seconds(64)(0)
    assert many < p.decode_seconds(8)(0) - p.decode_seconds(1)(0)  # all 8 read by 64 tokens: only per-token costs grow


def test_fp8_weights_are_read_at_one_byte_and_computed_on_fp8_tensor_cores():
    bf16, fp8 = profile("llama-3.1-8b"), profile("llama-3.1-8b", dtype="fp8")
    assert fp8.sizes["dense_bytes"] * 2 == bf16.sizes["dense_bytes"]
    assert fp8.sizes["gemm_peak"] == H100["fp8"] and bf16.sizes["gemm_peak"] == H100["peak"]
    assert profile("llama-4-scout-fp8", tp=2).dtype == "fp8"  # from the config's quantization_config


def test_gqa_heads_split_over_tp_and_are_replicated_past_their_number():
    assert profile("llama-3.1-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert profile("llama-3.1-70b", tp=8).sizes["kv_token_layer"] == 2 * 1 * 128 * 2  # 8 KV heads over 8 GPUs
    assert load_model_shape("qwen2.5-7b").num_kv_heads == 4
    p = roofline_profile(load_hardware("h100-sxm"), "qwen2.5-7b", 2)
    assert p.sizes["kv_token_layer"] == 2 * 2 * 128 * 2


def test_the_kv_cache_is_what_vllm_leaves_of_the_memory():
    p = profile("llama-2-7b", max_num_batched_tokens=2048)
    weights = (32 * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 2 * 32000 * 4096) * 2
    activations = 2048 * (2 * 11008 + 4 * 4096) * 2 + 1.5 * GIB
    free = 0.9 * 79.19 * GIB - weights - activations
    assert p.num_kv_blocks(16) == int(free // (16 * 32 * 2 * 32 * 128 * 2))
    assert 7000 < p.num_kv_blocks(16) < 7600  # about 116,000 tokens, as vLLM reports for this model on an H100
    with pytest.raises(ValueError, match="no memory for the KV cache"):
        roofline_profile("l40s", "llama-2-70b", 1)


def test_window_pairs_and_reads():
    assert pairs(0, 4) == 1 + 2 + 3 + 4
    assert pairs(10, 3) == 11 + 12 + 13
    assert pairs(10, 3, window=12) == 11 + 12 + 12
    assert pairs(20, 3, window=8) == 3 * 8
    assert read(100, 1, window=64) == 65 and read(100, 1) == 101


def test_a_chunk_after_its_context_costs_its_pairs_and_the_decodes_their_reads():
    """A real engine step: a prompt chunked behind a decode, as the executor sees it before the step applies."""
    config = EngineConfig(
        vllm_engine="v1",
        max_num_batched_tokens=64,
        max_num_seqs=8,
        max_model_len=1024,
        num_gpu_blocks=200,
        enable_prefix_caching=False,
        watermark=0.0,
    )
    seen = []

    class Recording(SimulatedExecutor):
        def execute(self, output):
            seen.append(
                (
                    attention_work(output),
                    [(sg.num_tokens, sg.group.seqs[0].num_computed_tokens) for sg in output.scheduled],
                )
            )
            return super().execute(output)

    engine = Engine(config, "vllm-v1", Recording(profile("llama-2-7b")))
    engine.run(
        [
            Request(request_id="a", prompt_len=10, output_len=5, sampling=SamplingParams(max_tokens=5)),
            Request(
                request_id="b", prompt_len=150, output_len=2, sampling=SamplingParams(max_tokens=2), arrival_time=1e-6
            ),
        ]
    )
    for work, entries in seen:
        assert work.prefill_pairs == sum(pairs(ctx, n) for n, ctx in entries if n > 1)
        assert work.decode_kv == sum(ctx + 1 for n, ctx in entries if n == 1)
    chunked = [entries for _, entries in seen if any(n > 1 and ctx > 0 for n, ctx in entries)]
    assert chunked, "the long prompt was chunked after a context"


def test_decode_seconds_is_what_a_decode_step_is_charged():
    p = profile("codellama-34b", tp=2)
    config = EngineConfig(max_num_seqs=4, num_gpu_blocks=400, max_model_len=512)
    charged = []

    class Recording(SimulatedExecutor):
        def execute(self, output):
            result = super().execute(output)
            if output.decode_seqs and not output.prefill_tokens:
                charged.append((output.decode_seqs, output.kv_tokens_read, result.duration))
            return result

    engine = Engine(config.model_copy(update={"decode_lane": False}), "vllm-default", Recording(p))
    engine.run(
        [
            Request(request_id=str(i), prompt_len=20 + i, output_len=6, sampling=SamplingParams(max_tokens=6))
            for i in range(3)
        ]
    )
    assert charged
    for d, k, seconds in charged:
        assert p.decode_seconds(d)(k) == seconds


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


LLAMA = json.loads(shipped_models()["llama-3.1-8b"].read_text())


@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"hidden_size": "4096"}, "hidden_size"),
        ({"architectures": ["DeepseekV3ForCausalLM"]}, "architectures"),
        ({"architectures": None}, "architectures"),
        ({"num_key_value_heads": 7}, "num_key_value_heads"),
        ({"torch_dtype": "int4"}, "torch_dtype"),
    ],
)
def test_a_bad_config_names_its_file_and_field(tmp_path, change, field):
    data = {k: v for k, v in {**LLAMA, **change}.items() if v is not None}
    path = write(tmp_path, data)
    with pytest.raises(ModelConfigError) as err:
        load_model_shape(path)
    assert str(path) in str(err.value) and field in str(err.value)


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path):
    with pytest.raises(ModelConfigError, match="num_attention_heads.*32 attention heads do not split over --tp 3"):
        roofline_profile("h100-sxm", "llama-3.1-8b", 3)
    with pytest.raises(ModelConfigError, match="num_key_value_heads"):
        roofline_profile(
            "h100-sxm", "qwen2.5-7b", 14
        )  # 28 heads split over 14, 4 KV heads neither split nor replicate evenly
    with pytest.raises(HardwareError, match="unknown hardware 'tpu'"):
        roofline_profile("tpu", "llama-3.1-8b")
    with pytest.raises(ProfileError, match="--dtype"):
        roofline_profile("h100-sxm", "llama-3.1-8b", 1, "int4")


def test_moe_and_windowed_shapes_read_from_their_configs():
    mixtral = load_model_shape("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.moe_layers, mixtral.intermediate_size) == (
        8,
        2,
        32,
        0,
    )
    assert abs(mixtral.num_params() - 46.7e9) < 0.1e9
    qwen = load_model_shape("qwen3-30b-a3b")
    assert (qwen.num_experts, qwen.experts_per_token, qwen.expert_intermediate_size) == (128, 8, 768)
    scout = load_model_shape("llama-4-scout-fp8")
    assert scout.sliding_window == 8192 and scout.window_layers == 36 and scout.moe_layers == 48
    assert load_model_shape("qwen2.5-7b").sliding_window is None  # use_sliding_window false
    mistral = dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=4096)
    assert roofline_profile("h100-sxm", model_shape(mistral, "m.json", "m"), 1).decode_exact is False


def test_a_windowed_model_runs_step_by_step_and_an_exact_one_takes_the_fast_paths():
    """A profile whose decode time depends on each context (decode_exact False) turns off the decode lane, and
    with it the steady runs built on the lane (executors/fast_path.py); an exact profile keeps both."""
    from kvsched.executors.settings import fit_to_profile
    from kvsched.plugins.discovery import load_policy

    windowed = profile(model_shape(dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=64), "m.json", "m"))
    exact = profile("llama-3.1-8b")
    config = EngineConfig(max_num_seqs=8, max_model_len=2048, num_gpu_blocks=512)
    engines = {}
    for p in (windowed, exact):
        fitted = fit_to_profile(config, p, load_policy("vllm-default"))
        engines[p.decode_exact] = engine = Engine(fitted, "vllm-default", SimulatedExecutor(p))
        engine.run(
            [
                Request(request_id=str(i), prompt_len=100, output_len=50, sampling=SamplingParams(max_tokens=50))
                for i in range(4)
            ]
        )
        assert len(engine.finished) == 4
    assert engines[False].config.decode_lane is False
    assert engines[False].scheduler.fast_path is None and engines[False].fast_path is None
    assert engines[True].scheduler.fast_path is not None and engines[True].fast_path.runs is not None

"""A transformer's shape, read from its Hugging Face ``config.json``: what a step's time depends on.

The roofline cost model (``executors/roofline.py``) needs only the shapes of the matrices a step
multiplies and the KV cache it reads: layers, widths, attention heads (GQA/MQA), the dense MLP or
the experts a token is routed to (top-k of E, shared experts, which layers are MoE), sliding
windows, the vocabulary and the weights' dtype. ``load_model_shape`` reads them from a config file
(or a folder holding one, or a shipped name), checking each field it needs; a missing or wrong one,
an architecture it does not know, or a tensor-parallel degree the heads do not split over is one
``ModelConfigError`` naming the file and the field. No hub access: the user gives the file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvsched.errors import quote
from kvsched.userfiles.reader import FileError, read_json

DENSE = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "GraniteForCausalLM",
        "Phi3ForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
    }
)
MOE = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Llama4ForConditionalGeneration"})
ARCHITECTURES = DENSE | MOE
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
MAX_WIDTH = 1 << 20
# The shipped configs (executors/data/models/NAME.json) by the Hugging Face id a server names its model with.
HF_IDS = {
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b",
    "codellama/codellama-34b-instruct-hf": "codellama-34b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "mistralai/mistral-nemo-instruct-2407": "mistral-nemo-12b",
    "qwen/qwen3-30b-a3b": "qwen3-30b-a3b",
    "redhatai/llama-4-scout-17b-16e-instruct-fp8-dynamic": "llama-4-scout-fp8",
}  # a width, head count or vocabulary past a million is a typo, not a model


class ModelConfigError(FileError):
    """A ``config.json`` cannot describe a model the cost model knows; names the file and the field."""

    def __init__(self, message: str, path: str | Path | None = None, field: str | None = None) -> None:
        super().__init__(f"field {field!r}: {message}" if field else message, path)


class ModelShape(BaseModel):
    """What the cost model reads of a transformer (per-layer sizes; counts of each kind of layer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    architecture: str
    hidden_size: int = Field(ge=1, le=MAX_WIDTH)
    num_layers: int = Field(ge=1, le=10_000)
    num_heads: int = Field(ge=1, le=MAX_WIDTH)
    num_kv_heads: int = Field(ge=1, le=MAX_WIDTH)
    head_dim: int = Field(ge=1, le=MAX_WIDTH)
    intermediate_size: int = Field(ge=0, le=MAX_WIDTH, description="a dense layer's MLP width (0: no dense layer)")
    vocab_size: int = Field(ge=1, le=1 << 24)
    max_position_embeddings: int = Field(ge=1)
    tie_word_embeddings: bool = False
    dtype: str = Field("bf16", description="the weights' dtype as the config gives it: bf16, fp16, fp32 or fp8")
    num_experts: int = Field(0, ge=0, le=MAX_WIDTH, description="routed experts of an MoE layer (0: dense)")
    experts_per_token: int = Field(0, ge=0, le=MAX_WIDTH, description="top-k: the experts each token is routed to")
    expert_intermediate_size: int = Field(0, ge=0, le=MAX_WIDTH)
    shared_expert_intermediate_size: int = Field(
        0, ge=0, le=MAX_WIDTH, description="an always-on expert's width (0: none)"
    )
    moe_layers: int = Field(0, ge=0, description="how many layers route to experts (the others are dense)")
    sliding_window: int | None = Field(None, ge=1, description="tokens a windowed layer attends to")
    window_layers: int = Field(0, ge=0, description="how many layers attend within the window (the others globally)")

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    def attention_params(self) -> int:
        """One layer's q, k, v and o projections."""
        q = self.num_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * self.num_kv_heads * self.head_dim)

    def num_params(self) -> int:
        """All weights: layers, embeddings and (untied) LM head; norms and biases left out."""
        mlp = 3 * self.hidden_size
        per_layer = self.attention_params()
        total = self.num_layers * per_layer + self.dense_layers * mlp * self.intermediate_size
        experts = self.num_experts * self.expert_intermediate_size + self.shared_expert_intermediate_size
        total += self.moe_layers * (mlp * experts + self.hidden_size * self.num_experts)
        return total + self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def check_tp(self, tp: int, where: str | Path) -> None:
        """vLLM splits the query heads over ``tp`` GPUs and the KV heads too (or replicates them, when fewer)."""
        if self.num_heads % tp:
            raise ModelConfigError(
                f"{self.num_heads} attention heads do not split over --tp {tp}", where, field="num_attention_heads"
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ModelConfigError(
                f"{self.num_kv_heads} KV heads neither split over nor replicate across --tp {tp}",
                where,
                field="num_key_value_heads",
            )


def shipped_models() -> dict[str, Path]:
    """The configs that ship with kvsched (``executors/data/models/NAME.json``), by name."""
    folder = resources.files("kvsched.executors") / "data" / "models"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json")}


def load_model_shape(source: str | Path) -> ModelShape:
    """The shape in ``source``: a shipped name, a ``config.json`` file, or a folder holding one."""
    shipped = shipped_models()
    text = str(source)
    if text in shipped:
        path = shipped[text]
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise ModelConfigError(
                f"no such model config (a config.json, a folder holding one, or one of {', '.join(sorted(shipped))})",
                source,
            )
    data = read_json(path, "model config")
    if not isinstance(data, dict):
        raise ModelConfigError("not a model config: expected a JSON object", path)
    return model_shape(data, path, name=path.parent.name if path.name == "config.json" else path.stem)


def model_shape(data: dict[str, Any], path: str | Path, name: str) -> ModelShape:
    """A ``ModelShape`` from a parsed ``config.json`` (``path`` is where errors say it came from)."""
    architectures = data.get("architectures")
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise ModelConfigError("missing or not a list of names (which model class is it?)", path, field="architectures")
    arch = architectures[0]
    if arch not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelConfigError(
            f"unknown architecture {quote(arch)}; the cost model knows {known}", path, field="architectures"
        )
    text = data.get("text_config", data) if arch.endswith("ForConditionalGeneration") else data
    if not isinstance(text, dict):
        raise ModelConfigError("not an object", path, field="text_config")
    field = _Fields(text, path, arch)
    hidden, layers, heads = field.int("hidden_size"), field.int("num_hidden_layers"), field.int("num_attention_heads")
    kv_heads = field.int("num_key_value_heads", heads)
    head_dim = field.int("head_dim", 0) or _divide(hidden, heads, path)
    shape: dict[str, Any] = dict(
        name=name,
        architecture=arch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=field.int("vocab_size"),
        max_position_embeddings=field.int("max_position_embeddings", 4096),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", data.get("tie_word_embeddings", False))),
        dtype=_dtype(data, text, path),
    )
    if kv_heads > heads or heads % kv_heads:
        raise ModelConfigError(
            f"{kv_heads} KV heads do not group {heads} query heads", path, field="num_key_value_heads"
        )
    shape.update(_mlp(field, arch, layers))
    shape.update(_windows(field, text, arch, layers))
    try:
        return ModelShape(**shape)
    except ValueError as exc:  # a bound of ModelShape's: name the field as the config spells it
        first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": ("?",), "msg": str(exc)}
        raise ModelConfigError(first["msg"], path, field=str(first["loc"][0])) from None


class _Fields:
    """Reads a config's integer fields, each checked (an error names the file and the field)."""

    def __init__(self, data: dict[str, Any], path: str | Path, arch: str) -> None:
        self.data, self.path, self.arch = data, path, arch

    def int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise ModelConfigError(f"missing (a {self.arch} config needs it)", self.path, field=key)
        if type(value) is not int or value < 0:
            raise ModelConfigError(f"must be a non-negative integer, got {quote(value)}", self.path, field=key)
        return value


def _divide(hidden: int, heads: int, path: str | Path) -> int:
    if hidden % heads:
        raise ModelConfigError(
            f"hidden_size {hidden} is not a multiple of the {heads} heads; give head_dim", path, field="head_dim"
        )
    return hidden // heads


def _dtype(data: dict[str, Any], text: dict[str, Any], path: str | Path) -> str:
    quant = data.get("quantization_config") or text.get("quantization_config")
    if isinstance(quant, dict) and _is_fp8(quant):
        return "fp8"
    name = text.get("torch_dtype", text.get("dtype", data.get("torch_dtype", data.get("dtype", "bfloat16"))))
    if name not in DTYPES:
        raise ModelConfigError(f"unknown dtype {quote(name)}; known: {', '.join(DTYPES)}", path, field="torch_dtype")
    return DTYPES[name]


def _is_fp8(quant: dict[str, Any]) -> bool:
    """FP8 weights: ``quant_method: fp8``, or compressed-tensors whose weights are 8-bit floats."""
    if quant.get("quant_method") == "fp8":
        return True
    groups = quant.get("config_groups")
    if isinstance(groups, dict):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and weights.get("num_bits") == 8 and weights.get("type") == "float":
                return True
    return False


def _mlp(field: _Fields, arch: str, layers: int) -> dict[str, Any]:
    """The dense MLP width and, for an MoE model, its experts and which layers use them."""
    if arch in DENSE:
        return {"intermediate_size": field.int("intermediate_size")}
    if arch == "MixtralForCausalLM":
        width = field.int("intermediate_size")
        return {
            "intermediate_size": 0,
            "num_experts": field.int("num_local_experts"),
            "experts_per_token": field.int("num_experts_per_tok"),
            "expert_intermediate_size": width,
            "moe_layers": layers,
        }
    if arch == "Llama4ForConditionalGeneration":  # every step-th layer routes, with a shared expert; the rest are dense
        step = max(1, field.int("interleave_moe_layer_step", 1))
        width = field.int("intermediate_size")
        return {
            "intermediate_size": field.int("intermediate_size_mlp", width),
            "num_experts": field.int("num_local_experts"),
            "experts_per_token": field.int("num_experts_per_tok"),
            "expert_intermediate_size": width,
            "shared_expert_intermediate_size": width,
            "moe_layers": layers // step,
        }
    # Qwen2-MoE / Qwen3-MoE: every decoder_sparse_step-th layer routes, except those in mlp_only_layers
    step = max(1, field.int("decoder_sparse_step", 1))
    dense_only = field.data.get("mlp_only_layers") or []
    if not isinstance(dense_only, list):
        raise ModelConfigError(
            f"must be a list of layer numbers, got {quote(dense_only)}", field.path, field="mlp_only_layers"
        )
    moe = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    return {
        "intermediate_size": field.int("intermediate_size") if moe < layers else 0,
        "num_experts": field.int("num_experts"),
        "experts_per_token": field.int("num_experts_per_tok"),
        "expert_intermediate_size": field.int("moe_intermediate_size"),
        "shared_expert_intermediate_size": field.int("shared_expert_intermediate_size", 0),
        "moe_layers": moe,
    }


def _windows(field: _Fields, text: dict[str, Any], arch: str, layers: int) -> dict[str, Any]:
    """The sliding window and how many layers use it (Llama 4's chunked attention counts as one: a
    token attends within its chunk of ``attention_chunk_size``, on the layers that use RoPE)."""
    if arch == "Llama4ForConditionalGeneration":
        chunk = field.int("attention_chunk_size", 0)
        no_rope = text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]  # 1: RoPE, chunked
        return {"sliding_window": chunk, "window_layers": sum(1 for v in no_rope if v)} if chunk else {}
    window = text.get("sliding_window")
    if window is None or (arch.startswith("Qwen") and not text.get("use_sliding_window", False)):
        return {}
    window = field.int("sliding_window")
    types = text.get("layer_types")
    if isinstance(types, list):
        windowed = sum(1 for t in types if t == "sliding_attention")
    elif arch.startswith("Qwen"):  # layers from max_window_layers on use the window
        windowed = max(0, layers - field.int("max_window_layers", layers))
    elif arch == "Gemma2ForCausalLM":
        windowed = (layers + 1) // 2  # alternating, the first windowed
    elif arch.startswith("Gemma3"):
        pattern = field.int("sliding_window_pattern", 6)
        windowed = layers - layers // pattern
    else:
        windowed = layers
    return {"sliding_window": window, "window_layers": windowed} if windowed else {}

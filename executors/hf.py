"""The real executor: a transformers causal LM running on the engine's paged KV cache.

Each scheduler step becomes one packed forward over every scheduled token (prompts, prefill
chunks, recomputes and decodes together), with explicit position ids and the LM head applied
only to the last token of each sequence that samples. Before the forward the executor applies
the step's block movements to the real tensors: swap out, swap in, copy-on-write.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from kvsched.core.executor import StepResult
from kvsched.executors.clocks import WallClock
from kvsched.executors.hf_attention import StepMetadata, active_step, register
from kvsched.executors.hf_models import SUPPORTED_TYPES, LoadedModel, load_model
from kvsched.executors.sampler import sample_rows
from kvsched.kernels import PagedKVCache, choose_backend, get_attention

if TYPE_CHECKING:
    from kvsched.allocators.block_manager import BlockManager
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.core.outputs import SchedulerOutput


class UnsupportedModel(ValueError):
    """The model's attention cannot run on our paged backend (sliding windows, ALiBi, custom code)."""


def check_supported(config) -> None:
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedModel(f"model type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        raise UnsupportedModel("sliding-window attention is not supported by the paged attention kernels")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(config, "reorder_and_upcast_attn", False):
        raise UnsupportedModel("GPT-2 variants with per-layer attention scaling are not supported")


class HFExecutor:
    """Runs scheduler steps on a real model; ``attach`` it to the engine's block manager before the first step.

    ``backend`` picks the attention implementation (default: Triton on CUDA, torch otherwise).
    ``record_logits`` keeps each sampled row's logits per sequence id (for ``engine verify``).
    ``attend`` is the paged attention every layer of a step calls (``kvsched.kernels.get_attention(backend)``,
    read once a step): assign a function of the same signature to time it or replace it from the next step on
    (``benchmarks/cpu_decode_profile.py`` wraps it in a timer), and assign the old one back to undo that.
    """

    def __init__(
        self,
        model: LoadedModel | str,
        config: EngineConfig,
        backend: str | None = None,
        device: str | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        record_logits: bool = False,
    ) -> None:
        if config.kv_offloading_blocks:  # its CPU cache is the swap pool: it holds no copies of a CPU tier to load
            raise ValueError("kv_offloading_blocks is simulated only: the HF executor keeps no CPU tier")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.loaded = load_model(model) if isinstance(model, str) else model
        hf = self.loaded.model
        check_supported(hf.config)
        if device is not None:
            hf.to(device)
        self.device = next(hf.parameters()).device
        self.eos_token_id = self.loaded.eos_token_id
        self.backend = choose_backend(self.device, backend)
        self.attend = get_attention(self.backend)
        cfg = hf.config
        num_heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads
        num_kv_heads = getattr(cfg, "num_key_value_heads", None) or num_heads
        self.cache = PagedKVCache(
            cfg.num_hidden_layers,
            config.num_gpu_blocks,
            config.num_cpu_blocks,
            config.block_size,
            num_kv_heads,
            head_dim,
            dtype=next(hf.parameters()).dtype,
            device=self.device,
        )
        self.block_size = config.block_size
        self.max_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        self.generator = torch.Generator().manual_seed(seed)
        self.record_logits = record_logits
        self.logits: dict[int, list[torch.Tensor]] = {}
        self.block_manager: BlockManager | None = None
        self.prefix_hit_tokens = 0  # prompt tokens whose K/V came from the prefix cache
        self._computed_upto: dict[int, int] = {}
        self._attn_name = register()

    # ------------------------------------------------------------------------------ wiring
    def attach(self, block_manager: BlockManager) -> HFExecutor:
        """Read block tables from this block manager (the engine's); its pools must fit the cache (V1's may be
        a block short: it keeps one as its null block, which the cache then holds unused)."""
        if (
            block_manager.block_size != self.block_size
            or block_manager.gpu.num_blocks > self.cache.gpu.shape[2]
            or block_manager.cpu.num_blocks > self.cache.cpu.shape[2]
        ):
            raise ValueError("the block manager's block size or pools do not fit the executor's cache")
        self.block_manager = block_manager
        return self

    def make_clock(self) -> WallClock:
        return WallClock()

    # ------------------------------------------------------------------------------- steps
    def execute(self, output: SchedulerOutput) -> StepResult:
        """Move blocks (swap out, swap in, copy: a freed block may be reused in the same step), then run the batch."""
        start = time.perf_counter()
        if self.block_manager is None:
            raise RuntimeError("HFExecutor.attach(block_manager) must be called before the first step (Engine does it)")
        cache = self.cache
        cache.swap_out(output.blocks_to_swap_out)
        cache.swap_in(output.blocks_to_swap_in)
        cache.copy(output.blocks_to_copy)
        tokens = self._forward_and_sample(output) if output.scheduled else {}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(max(time.perf_counter() - start, 1e-6), tokens)

    def _forward_and_sample(self, output: SchedulerOutput) -> dict[int, list[int]]:
        """Pack every scheduled chunk into one ``[1, T]`` forward; sample for sequences that finish computing."""
        bs, tables = self.block_size, self.block_manager.gpu_tables
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        seq_lens: list[int] = []
        rows: list[list[int]] = []
        keep: list[int] = []  # packed index of each sampling sequence's last token
        sampling = []  # (seq, count) per kept row
        for sg in output.scheduled:
            wanted = dict((s.seq_id, n) for s, n in sg.samples())
            for seq, n in sg.seq_chunks():
                begin = seq.num_computed_tokens
                end = begin + n
                table = tables[seq.seq_id]
                seen = self._computed_upto.get(seq.seq_id)
                # A first prefill (or a re-prefill after recompute) that starts past 0 reuses cached blocks.
                if begin > 0 and len(seq.group.seqs) == 1 and (seen is None or begin < seen):
                    self.prefix_hit_tokens += begin
                self._computed_upto[seq.seq_id] = end
                ids += seq.token_slice(begin, end)
                positions += range(begin, end)
                slots += [table[p // bs] * bs + p % bs for p in range(begin, end)]
                cu.append(len(ids))
                seq_lens.append(end)
                rows.append(table)
                if seq.seq_id in wanted:
                    keep.append(len(ids) - 1)
                    sampling.append((seq, wanted[seq.seq_id]))
        if self.max_positions is not None and max(seq_lens) > self.max_positions:
            raise ValueError(f"a sequence reached {max(seq_lens)} tokens; the model supports {self.max_positions}")
        dev = self.device
        width = max(len(r) for r in rows)
        meta = StepMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=dev),
            max_query_len=max(cu[i + 1] - cu[i] for i in range(len(seq_lens))),
        )
        model = self.loaded.model
        if model.config._attn_implementation != self._attn_name:
            model.set_attn_implementation(self._attn_name)
        with torch.inference_mode(), active_step(self.cache, meta, self.attend):
            logits = model(
                input_ids=torch.tensor([ids], device=dev),
                position_ids=torch.tensor([positions], device=dev),
                use_cache=False,
                logits_to_keep=torch.tensor(keep, dtype=torch.long, device=dev),
            ).logits[0]
        if not sampling:
            return {}
        logits = logits.float().cpu()
        if self.record_logits:
            for (seq, _), row in zip(sampling, logits):
                self.logits.setdefault(seq.seq_id, []).append(row.clone())
        sample_info = []
        for seq, count in sampling:
            group = seq.group
            ordinal = group.seqs.index(seq) if len(group.seqs) > 1 else 0
            sample_info.append((group.request.sampling, ordinal, len(seq.output), count))
        drawn = sample_rows(logits, sample_info, self.generator)
        return {seq.seq_id: toks for (seq, _), toks in zip(sampling, drawn)}


def hf_engine(
    model: LoadedModel | str,
    config: EngineConfig | None = None,
    policy="vllm-default",
    policy_options=None,
    observers: tuple = (),
    **executor_options,
) -> Engine:
    """An engine whose executor is an ``HFExecutor`` reading the engine's own block tables."""
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine

    config = config or EngineConfig()
    executor = HFExecutor(model, config, **executor_options)
    return Engine(
        config, policy, executor, policy_options=policy_options, observers=observers
    )  # the engine attaches the executor

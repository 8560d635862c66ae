"""What a user submits: sampling parameters and a request, validated at the edge with pydantic."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WrapValidator, field_validator, model_validator

from kvsched.allocators.block_prompt import BlockPrompt

# Counts and ids must fit a signed 64-bit integer (the results' Parquet and NumPy columns);
# priorities a 32-bit one, as trace files give them. Floats must be finite.
MAX_INT64 = 2**63 - 1
Int64 = Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]
# One request's tokens (its prompt, its max_tokens) at most, and the engine's token settings: a bound
# vLLM's int32 token positions share, and one that keeps every sum a run takes (tokens per step, per
# request, per run: at most 64 sequences × 2**31 tokens per request) far inside int64.
MAX_TOKENS = 1 << 31
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Priority = Annotated[int, Field(ge=-(2**31), lt=2**31, description="lower is more urgent (vLLM convention)")]
Label = Annotated[str, Field(min_length=1, max_length=256)]  # a name a policy groups requests by


class SamplingParams(BaseModel):
    """How to sample a request's output sequences (vLLM's names and meanings)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n: int = Field(1, ge=1, le=64, description="number of output sequences (parallel sampling)")
    max_tokens: Tokens = Field(16, description="upper bound on generated tokens per sequence")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=MAX_INT64, description="0 disables top-k")
    seed: Int64 | None = None
    stop_token_ids: tuple[Int64, ...] = ()
    ignore_eos: bool = False


# The names a request carries for policies (and clients send vLLM in vllm_xargs).
LABELS = ("tenant", "session_id", "slo_class")


class Request(BaseModel):
    """One user request: a prompt (token ids) plus how to sample it and scheduling metadata.

    A simulation may give only ``prompt_len``: the engine then uses token ids unique to the request, so that no
    two such prompts share a cached prefix by accident. A hash-id trace's prompt is a ``BlockPrompt``: it reads as
    its token ids, made only where they are read. ``output_len`` is the number of tokens the request will really
    generate (from a workload or a trace): the simulated executor needs it because it has no model to emit EOS; a
    real executor ignores it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    request_id: str = Field(min_length=1)
    prompt_token_ids: Annotated[
        tuple[Int64, ...], WrapValidator(lambda v, f: v if type(v) is BlockPrompt else f(v)), PlainSerializer(tuple)
    ] = Field((), max_length=MAX_TOKENS)  # a BlockPrompt kept
    prompt_len: int = Field(0, ge=0, le=MAX_TOKENS, description="prompt length; derived from the token ids when given")
    sampling: SamplingParams = SamplingParams()
    arrival_time: float = Field(0.0, ge=0.0)
    priority: Priority = 0
    tenant: str = "default"
    output_len: Tokens | None = None
    session_id: Label | None = Field(None, description="the conversation it continues (session affinity)")
    slo_class: Label | None = Field(
        None, description="its service class, e.g. interactive or batch (SLO-aware policies)"
    )
    grammar_compile_s: float | None = Field(
        None,
        ge=0.0,
        description="a structured-output request: its grammar is ready this many seconds after arrival; "
        "until then V1 mechanics keep it waiting, skipped by vllm-v1 (docs/vllm-v1.md)",
    )

    @field_validator(*LABELS)
    @classmethod
    def _named(cls, name: str | None, info) -> str | None:
        if name is not None and not name.strip():
            raise ValueError(f"a {info.field_name} needs a name (it is empty or blank)")
        return name

    @model_validator(mode="before")
    @classmethod
    def _derive_prompt_len(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("prompt_token_ids"):
            given = data.get("prompt_len")
            tokens = len(data["prompt_token_ids"])
            if given not in (None, 0, tokens):
                raise ValueError(f"prompt_len ({given}) disagrees with len(prompt_token_ids) ({tokens})")
            data = {**data, "prompt_len": tokens}
        return data

    @model_validator(mode="after")
    def _check(self) -> Request:
        if self.prompt_len < 1:
            raise ValueError("prompt is empty: give prompt_token_ids or prompt_len >= 1")
        if self.output_len is not None and self.output_len > self.sampling.max_tokens:
            raise ValueError(f"output_len ({self.output_len}) exceeds sampling.max_tokens ({self.sampling.max_tokens})")
        if not (self.request_id.isascii() and self.tenant.isascii()) or self.session_id or self.slo_class:
            _check_utf8(self)
        return self


def _check_utf8(request: Request) -> None:
    """The names go into UTF-8 results (Parquet, CSV, JSON): a lone surrogate would fail them at the end of the run."""
    for name in ("request_id", *LABELS):
        text = getattr(request, name)
        if text is not None and not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                raise ValueError(f"{name} is not valid UTF-8 (it holds a lone surrogate)") from None

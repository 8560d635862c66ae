"""What a user submits: sampling parameters and a request, validated at the edge with pydantic."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WrapValidator, field_validator, model_validator

from kvsched.allocators.block_prompt import BlockPrompt

# Counts and ids fit the results' int64 columns; priorities an int32, as trace files give them. Floats are finite.
MAX_INT64 = 2**63 - 1
Int64 = Annotated[int, Field(ge=-MAX_INT64 - 1, le=MAX_INT64)]
# A request's tokens (prompt, max_tokens) and the engine's token settings at most: vLLM's int32 positions, and far
# inside int64 for every sum a run takes (at most 64 sequences × 2**31 tokens per request).
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


# The names a request carries for policies (clients send vLLM them in vllm_xargs).
LABELS = ("tenant", "session_id", "slo_class")


class Request(BaseModel):
    """One user request: a prompt, how to sample it and scheduling metadata.

    A simulation may give only ``prompt_len`` (the engine then makes token ids unique to the request), or a hash-id
    trace's ``BlockPrompt`` (ids made where read). ``output_len``, the tokens it will really generate, is for the
    simulated executor, which has no model to emit EOS.
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
    slo_class: Label | None = Field(None, description="its service class, e.g. interactive or batch")
    grammar_compile_s: float | None = Field(
        None, ge=0.0, description="structured output: seconds from arrival until its grammar is ready (docs/vllm-v1.md)"
    )

    @field_validator("request_id", *LABELS)
    @classmethod
    def _named(cls, name: str | None, info) -> str | None:
        """Names go into UTF-8 results (Parquet, CSV, JSON), which a lone surrogate would fail at the end of the run."""
        if name is not None and not name.isascii():
            try:
                name.encode()
            except UnicodeEncodeError:
                raise ValueError(f"{info.field_name} is not valid UTF-8 (it holds a lone surrogate)") from None
        if name is not None and not name.strip() and info.field_name != "request_id":
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
        return self

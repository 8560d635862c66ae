"""What a user submits: sampling parameters and a request, validated at the edge with pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingParams(BaseModel):
    """How to sample a request's output sequences (vLLM's names and meanings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1, le=64, description="number of output sequences (parallel sampling)")
    max_tokens: int = Field(16, ge=1, description="upper bound on generated tokens per sequence")
    temperature: float = Field(0.0, ge=0.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


class Request(BaseModel):
    """One user request: a prompt (token ids) plus how to sample it and scheduling metadata.

    A simulation may give only ``prompt_len``: the engine then uses token ids unique to the
    request, so that no two such prompts share a cached prefix by accident.
    ``output_len`` is the number of tokens the request will really generate (from a workload or a
    trace). The simulated executor needs it because it has no model to emit EOS; a real executor
    ignores it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(min_length=1)
    prompt_token_ids: tuple[int, ...] = ()
    prompt_len: int = Field(0, ge=0, description="prompt length; derived from the token ids when given")
    sampling: SamplingParams = SamplingParams()
    arrival_time: float = Field(0.0, ge=0.0)
    priority: int = Field(0, description="lower is more urgent (vLLM convention)")
    tenant: str = "default"
    output_len: int | None = Field(None, ge=1)

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
            raise ValueError(
                f"output_len ({self.output_len}) exceeds sampling.max_tokens ({self.sampling.max_tokens})"
            )
        return self


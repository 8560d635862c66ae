"""An inference-perf config as a workload: its ``data`` and ``load`` sections, the requests inference-perf
0.7 would send (``--workload FILE.yaml``).

inference-perf (kubernetes-sigs/inference-perf) is the load generator of llm-d and of the BLIS team's
published H100 runs. What is reproduced, read from its 0.7.0 source:

- ``data.type: shared_prefix``: ``num_groups`` system prompts (``system_prompt_len``), each with
  ``num_prompts_per_group`` questions (``question_len``) and output lengths (``output_len``), each
  a fixed length or a distribution, drawn as inference-perf draws them (``inference_perf_draws``:
  the system lengths, then per group its question and output lengths, from one generator seeded by
  ``seed``); the prompts (system prompt + question) are shuffled, and request i of a stage sends
  prompt ``i mod N``, so every prompt recurs every N requests with the same tokens (what makes the
  prefix cache matter). The older names of published result folders, ``num_unique_system_prompts``
  and ``num_users_per_system_prompt``, are read as ``num_groups`` and ``num_prompts_per_group``.
  With ``enable_multi_turn_chat``, prompt i belongs to user i: a user's round sends its context
  (empty at each stage's start) and its prompt, waits for the round before it to finish, and its
  context grows by the prompt and the answer (``workloads/client_loop.py``).
- ``data.type: random`` and ``synthetic``: ``total_count`` input and output lengths
  (``input_distribution``, ``output_distribution``) drawn by inference-perf's older sampler, request
  i of each stage taking the i-th; every prompt is fresh text (no shared prefix).
- ``load.type: constant`` and ``poisson``, in ``stages`` of ``rate`` and ``duration``: each stage
  sends ``int(rate × duration)`` requests (``inference_perf_draws``), and the next starts once it
  has drained, ``interval`` seconds later (plus the second inference-perf gives itself to start).

What is not: the exact shuffle and send times (inference-perf shuffles after drawing token text with
the same generator, and its load timers are unseeded: here both come from ``seed``), the text
itself (token ids stand for it), and every other data type (an error naming it). Each request is
sent with ``max_tokens`` its output length and, as inference-perf's vLLM client asks by default,
``ignore_eos``, so it generates exactly that many tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsched.core.request import Request, SamplingParams
from kvsched.userfiles.reader import read_text
from kvsched.workloads.errors import MAX_REQUESTS, WorkloadError
from kvsched.workloads.inference_perf_draws import Distribution, constant_times, generate, poisson_times, sample

SUPPORTED_DATA = ("shared_prefix", "random", "synthetic")
DEFAULT_TIMEOUT_S = 300.0  # aiohttp's total timeout, what inference-perf's client keeps when request_timeout is unset
STAGE_START_S = 1.5  # a stage's first send: a second after it starts, and half of the second its drain check polls at


class SharedPrefix(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    num_groups: int = Field(
        10, ge=1, le=100_000, validation_alias=AliasChoices("num_groups", "num_unique_system_prompts")
    )
    num_prompts_per_group: int = Field(
        10, ge=1, le=100_000, validation_alias=AliasChoices("num_prompts_per_group", "num_users_per_system_prompt")
    )
    system_prompt_len: int | Distribution = 100
    question_len: int | Distribution = 50
    output_len: int | Distribution = 50
    seed: int | None = None
    question_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    enable_multi_turn_chat: bool = False

    @model_validator(mode="after")
    def _check(self) -> SharedPrefix:
        if isinstance(self.question_len, Distribution) and self.question_distribution is not None:
            raise ValueError("give question_len as a distribution or question_distribution, not both")
        if isinstance(self.output_len, Distribution) and self.output_distribution is not None:
            raise ValueError("give output_len as a distribution or output_distribution, not both")
        if self.num_groups * self.num_prompts_per_group > 1_000_000:
            raise ValueError("at most a million prompts (num_groups × num_prompts_per_group)")
        return self

    def dist(self, name: str) -> Distribution:
        value = getattr(self, name)
        legacy = {"question_len": self.question_distribution, "output_len": self.output_distribution}.get(name)
        return value if isinstance(value, Distribution) else legacy or Distribution.fixed(value)


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # the other generators' sections are not read

    type: str = "mock"
    input_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    shared_prefix: SharedPrefix | None = None
    use_chat_template: bool = False  # the lengths target the templated prompt: nothing changes here
    trace: Any = None

    @field_validator("type")
    @classmethod
    def _supported(cls, kind: str) -> str:
        if kind not in SUPPORTED_DATA:
            raise ValueError(f"data type {kind!r} is not reproduced; kvsched reproduces {', '.join(SUPPORTED_DATA)}")
        return kind

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.type == "shared_prefix" and self.shared_prefix is None:
            self.shared_prefix = SharedPrefix()
        if self.type != "shared_prefix":
            if self.trace is not None:
                raise ValueError("lengths from a trace file (data.trace) are not reproduced: give input_distribution")
            for name in ("input_distribution", "output_distribution"):
                dist = getattr(self, name)
                if dist is None or dist.total_count is None:
                    raise ValueError(f"{self.type} needs {name} with a total_count")
        return self


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate: float = Field(gt=0, le=1e6, description="requests per second")
    duration: int = Field(gt=0, le=10_000_000, description="seconds")


class LoadConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # workers, circuit breakers: not modelled

    type: Literal["constant", "poisson"] = "constant"
    interval: float = Field(1.0, ge=0, le=1e6)
    stages: list[Stage] = Field(min_length=1, max_length=100)
    sweep: None = None
    request_timeout: float | None = Field(None, gt=0)
    base_seed: int | None = None


class InferencePerfConfig(BaseModel):
    """The parts of an inference-perf config that decide the requests (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    data: DataConfig
    load: LoadConfig
    api: dict = Field(default_factory=dict)
    server: dict | None = None

    @property
    def ignore_eos(self) -> bool:
        return bool((self.server or {}).get("ignore_eos", True))


@dataclass(frozen=True)
class StagePlan:
    rate: float
    duration: float
    count: int


class InferencePerfWorkload:
    """The requests an inference-perf config sends (``drive`` runs them as its client does)."""

    def __init__(
        self,
        config: InferencePerfConfig,
        path: Path | None = None,
        seed: int = 0,
        max_requests: int | None = None,
        prompt_extra: int = 0,
        duration_scale: float = 1.0,
    ) -> None:
        self.config, self.path, self.seed, self.prompt_extra = config, path, seed, prompt_extra
        load = config.load
        self.timeout_s = load.request_timeout or DEFAULT_TIMEOUT_S
        # duration_scale < 1: each stage cut short (a quick look at a long run; the fit's rounds)
        self.stages = [
            StagePlan(s.rate, s.duration * duration_scale, int(s.rate * s.duration * duration_scale))
            for s in load.stages
        ]
        total = sum(s.count for s in self.stages)
        self.num_requests = min(total, max_requests) if max_requests else total
        if self.num_requests > MAX_REQUESTS:
            raise WorkloadError(f"the stages send {self.num_requests:,} requests, more than {MAX_REQUESTS:,}", path)
        self._next_id = 1  # fresh token ids count up from here; the simulator's own outputs are negative
        data = config.data
        if data.type == "shared_prefix":
            self._build_prompts(data.shared_prefix)
        else:
            self._build_lengths(data)
        self.client_log: list[ClientRecord] = []  # written by drive()

    @property
    def multi_turn(self) -> bool:
        sp = self.config.data.shared_prefix
        return sp is not None and sp.enable_multi_turn_chat

    # ----------------------------------------------------------------- what each request sends
    def _build_prompts(self, sp: SharedPrefix) -> None:
        rng = np.random.default_rng(_seed(self.seed if sp.seed is None else sp.seed))
        system = sample(sp.dist("system_prompt_len"), sp.num_groups, rng)
        questions, outputs = [], []
        for _ in range(sp.num_groups):
            questions.append(sample(sp.dist("question_len"), sp.num_prompts_per_group, rng))
            outputs.append(sample(sp.dist("output_len"), sp.num_prompts_per_group, rng))
        prompts, lens = [], []
        for g in range(sp.num_groups):
            shared = self._fresh(int(system[g]))
            for p in range(sp.num_prompts_per_group):
                prompts.append(shared + self._fresh(int(questions[g][p]) + self.prompt_extra))
                lens.append(int(outputs[g][p]))
        order = rng.permutation(len(prompts))
        self.prompts = [prompts[i] for i in order]
        self.output_lens = [max(1, lens[i]) for i in order]

    def _build_lengths(self, data: DataConfig) -> None:
        base_seed = self.config.load.base_seed
        rng = np.random.default_rng(_seed(self.seed if base_seed is None else base_seed))
        self.input_lens = generate(data.input_distribution, data.input_distribution.total_count, rng)
        self.output_lens = [
            max(1, int(n)) for n in generate(data.output_distribution, data.output_distribution.total_count, rng)
        ]
        short = min(len(self.input_lens), len(self.output_lens))
        for i, stage in enumerate(self.stages):
            if stage.count > short:
                raise WorkloadError(
                    f"load.stages.{i}: {stage.count:,} requests, but only {short:,} lengths drawn "
                    "(data.input_distribution.total_count): inference-perf fails the rest",
                    self.path,
                )

    def _fresh(self, n: int) -> tuple[int, ...]:
        start = self._next_id
        self._next_id += n
        return tuple(range(start, start + n))

    def prompt(self, index: int) -> tuple[int, ...]:
        """The tokens request ``index`` of a stage sends (before any multi-turn context)."""
        if self.config.data.type == "shared_prefix":
            return self.prompts[index % len(self.prompts)]
        return self._fresh(max(1, int(self.input_lens[index]) + self.prompt_extra))

    def output_len(self, index: int) -> int:
        return self.output_lens[index % len(self.output_lens)]

    def user(self, index: int) -> int | None:
        """The multi-turn user request ``index`` of a stage belongs to (None: no sessions)."""
        return index % len(self.prompts) if self.multi_turn else None

    def request(self, stage: int, index: int, sent: float, context: tuple[int, ...] = ()) -> Request:
        out = self.output_len(index)
        user = self.user(index)
        return Request(
            request_id=f"s{stage}-{index}",
            prompt_token_ids=context + self.prompt(index),
            output_len=out,
            arrival_time=sent,
            sampling=SamplingParams(max_tokens=out, ignore_eos=self.config.ignore_eos),
            session_id=None if user is None else f"u{user}",
        )

    # ----------------------------------------------------------------- when
    def send_times(self, stage: int, start: float) -> np.ndarray:
        """Stage ``stage``'s send times from ``start`` (its own generator: the same whatever ran before)."""
        plan = self.stages[stage]
        rng = np.random.default_rng([_seed(self.seed), 1, stage])
        if self.config.load.type == "constant":
            return constant_times(plan.rate, plan.duration, rng, start + STAGE_START_S)
        return poisson_times(plan.rate, plan.count, rng, start + STAGE_START_S)

    def stage_gap(self) -> float:
        """From a stage's drain to the next stage's start."""
        return self.config.load.interval

    # ----------------------------------------------------------------- the Workload protocol
    def drive(self, engine, on_step=None, overheads: tuple[float, float] = (0.0, 0.0)) -> None:
        """Run every stage on ``engine`` as inference-perf's client would (``workloads/client_loop.py``);
        ``overheads``: the serving stack's seconds before and after the engine (``StepCost.serving_seconds``)."""
        from kvsched.workloads.client_loop import ClientLoop

        self.client_log = ClientLoop(self, engine, overheads).run(on_step)

    def iter_requests(self) -> Iterator[Request]:
        """The open-loop approximation, for what cannot drive an engine (a fleet, ``engine bench``): stages
        back to back at their nominal ends, multi-turn rounds not waiting (their answers fresh tokens)."""
        start, made = 0.0, 0
        contexts: dict[int, tuple[int, ...]] = {}
        for s in range(len(self.stages)):
            times = self.send_times(s, start)
            contexts.clear()
            for i, t in enumerate(times):
                if made == self.num_requests:
                    return
                user = self.user(i)
                request = self.request(s, i, float(t), contexts.get(user, ()))
                if user is not None:
                    contexts[user] = request.prompt_token_ids + self._fresh(request.output_len)
                made += 1
                yield request
            start = (float(times[-1]) if len(times) else start) + self.stage_gap()

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    def tenant_names(self) -> set[str]:
        return {"default"}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "inference-perf",
            "path": str(self.path) if self.path else None,
            "seed": self.seed,
            "data": self.config.data.model_dump(mode="json", exclude_none=True),
            "load": self.config.load.model_dump(mode="json", exclude_none=True),
            "timeout_s": self.timeout_s,
            "prompt_extra": self.prompt_extra,
            "num_requests": self.num_requests,
        }


def _seed(seed: int) -> int:
    """A seed numpy takes (non-negative); inference-perf's own seeds are non-negative already."""
    return seed % (1 << 64)


@dataclass(frozen=True)
class ClientRecord:
    """What inference-perf's client saw of one request: its stage, when it was due and sent, and how it ended."""

    request_id: str
    stage: int
    scheduled: float
    sent: float | None  # None: never sent (the run was cut short)
    outcome: Literal["ok", "timeout", "refused"]


def load_inference_perf(
    path: Path, seed: int = 0, max_requests: int | None = None, prompt_extra: int = 0, duration_scale: float = 1.0
) -> InferencePerfWorkload:
    """The workload of an inference-perf config file (YAML or JSON); a bad field is one error naming file and field."""
    import yaml

    text = read_text(path, "inference-perf config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise WorkloadError(
            f"not valid YAML: {getattr(exc, 'problem', None) or exc}", path, None if mark is None else mark.line + 1
        ) from None
    if not isinstance(data, dict):
        raise WorkloadError("not an inference-perf config: expected a mapping with data and load sections", path)
    try:
        config = InferencePerfConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(
            str(p) for p in first["loc"] if not isinstance(p, str) or not p.startswith(("int", "Distribution"))
        )
        message = first["msg"].removeprefix("Value error, ")
        raise WorkloadError(f"field {where}: {message}" if where else message, path) from None
    return InferencePerfWorkload(config, path, seed, max_requests, prompt_extra, duration_scale)

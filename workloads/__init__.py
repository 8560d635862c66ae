"""Workloads: where simulated requests come from (synthetic specs, trace files, built-in traces)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from kvsched.core.request import Request
from kvsched.userfiles.reader import read_json
from kvsched.workloads.arrivals import Gamma, Poisson, make_arrivals
from kvsched.workloads.builtin import BUILTIN_SPECS, BUILTIN_TRACES, SHAREGPT_DEFAULT_RATE, builtin_path
from kvsched.workloads.errors import MAX_REQUESTS, WorkloadError
from kvsched.workloads.replay import TraceWorkload
from kvsched.workloads.synthetic import SyntheticSpec

WORKLOAD_NAMES = ("default", "synthetic", *BUILTIN_TRACES, *BUILTIN_SPECS)


class Workload(Protocol):
    """Where requests come from: ``iter_requests()`` makes them one at a time, in arrival order."""

    num_requests: int

    def requests(self) -> list[Request]: ...

    def iter_requests(self) -> Iterator[Request]: ...

    def tenant_names(self) -> set[str]: ...

    def describe(self) -> dict[str, Any]: ...


class _Embedded:
    """The core's embedded default job (``core.workload.SyntheticWorkload``), unchanged."""

    def __init__(self, **fields: Any) -> None:
        from kvsched.workloads.embedded import SyntheticWorkload

        self.spec = SyntheticWorkload(**fields)

    @property
    def num_requests(self) -> int:
        return self.spec.num_requests

    def requests(self) -> list[Request]:
        return self.spec.requests()

    def iter_requests(self) -> Iterator[Request]:
        return self.spec.iter_requests()

    def tenant_names(self) -> set[str]:
        return {"default"}

    def describe(self) -> dict[str, Any]:
        return {"kind": "default", **self.spec.model_dump()}


def build_workload(
    workload: str | None = None,
    trace: Path | None = None,
    *,
    num_requests: int | None = None,
    rate: float | None = None,
    rate_scale: float = 1.0,
    start_offset: float = 0.0,
    arrival: str | None = None,
    cv: float = 1.0,
    seed: int = 0,
    max_total_tokens: int | None = None,
) -> Workload:
    """Resolve the CLI's workload options to one workload.

    ``workload`` is a built-in name (``default``, ``synthetic``, ``azure-conv``, ``sharegpt``, or a named
    spec: ``sharegpt-4k``, ``tiered-sessions``, ``long-context``), a JSON spec file or an inference-perf config
    (``.yaml``); ``trace`` a CSV in any supported format. ``num_requests`` caps traces; ``max_total_tokens`` cuts
    their prompts as Vidur's trace replay does.
    ``rate`` replaces a named spec's Poisson rate (its requests', not a sessions spec's: scale those by ``rate_scale``).
    """
    check_options(num_requests=num_requests, rate=rate, rate_scale=rate_scale, start_offset=start_offset, cv=cv)
    if trace is not None and workload not in (None, "default"):
        raise WorkloadError("give either --workload or --trace, not both")
    if cv != 1.0 and arrival != "gamma":
        raise WorkloadError("--cv is the burstiness of gamma arrivals: give it with --arrival gamma")
    custom_arrivals = rate is not None or arrival not in (None, "poisson")
    if trace is not None and Path(trace).suffix == ".jsonl":  # hash ids: a trace with prefix structure
        from kvsched.workloads.prefix_trace import prefix_trace

        return prefix_trace(
            Path(trace), num_requests, rate_scale, seed, custom_arrivals or start_offset or max_total_tokens
        )
    if trace is None and workload in BUILTIN_SPECS:
        if arrival not in (None, "poisson") or start_offset or max_total_tokens is not None:
            raise WorkloadError(
                f"{workload} is a named spec: --arrival, --start-offset and max_total_tokens are its own"
            )
        return _named_spec(workload, num_requests, seed, rate, rate_scale)
    if trace is not None or workload in BUILTIN_TRACES:
        path = Path(trace) if trace is not None else builtin_path(workload)
        arrivals = None
        if workload == "sharegpt" or custom_arrivals:
            arrivals = make_arrivals(rate or SHAREGPT_DEFAULT_RATE, arrival or "poisson", cv)
        return TraceWorkload(
            path=path,
            name=None if trace is not None else workload,
            rate_scale=rate_scale,
            start_offset=start_offset,
            max_requests=num_requests,
            arrivals=arrivals,
            seed=seed,
            max_total_tokens=max_total_tokens,
        )
    if max_total_tokens is not None:
        raise WorkloadError("max_total_tokens (the prompt cut) applies to traces only")
    if start_offset:
        raise WorkloadError("--start-offset applies to traces only")
    if workload in (None, "default"):
        if arrival not in (None, "poisson"):
            raise WorkloadError(
                "the embedded default job has Poisson arrivals: use --workload synthetic for --arrival gamma"
            )
        fields: dict[str, Any] = {"seed": seed}
        if num_requests is not None:
            fields["num_requests"] = num_requests
        if rate is not None or rate_scale != 1.0:
            from kvsched.workloads.embedded import SyntheticWorkload

            fields["rate"] = (rate or SyntheticWorkload.model_fields["rate"].default) * rate_scale
        return _Embedded(**fields)
    if workload == "synthetic":
        spec = SyntheticSpec(
            seed=seed,
            arrivals=make_arrivals((rate or 4.0) * rate_scale, arrival or "poisson", cv),
            **({"num_requests": num_requests} if num_requests else {}),
        )
        return spec
    if Path(workload).suffix in (".yaml", ".yml"):  # an inference-perf config: its own data and load stages
        if custom_arrivals or rate_scale != 1.0:
            raise WorkloadError(
                "an inference-perf config sets its own load stages: drop --rate, --arrival and --rate-scale"
            )
        from kvsched.workloads.inference_perf import load_inference_perf

        return load_inference_perf(Path(workload), seed, num_requests)
    if custom_arrivals and Path(workload).suffix == ".json":
        raise WorkloadError(
            "a workload .json spec sets its own arrivals: drop --rate and --arrival (--rate-scale scales them)"
        )
    return load_spec(Path(workload), num_requests=num_requests, seed=seed, rate_scale=rate_scale)


def _named_spec(name: str, num_requests: int | None, seed: int, rate: float | None, rate_scale: float) -> Workload:
    """A built-in spec (``BUILTIN_SPECS``), with ``rate`` as its requests' Poisson rate where it has one."""
    spec = load_spec(builtin_path(name), num_requests=num_requests, seed=seed, rate_scale=rate_scale)
    if rate is None:
        return spec
    arrivals = getattr(spec, "arrivals", None)
    if arrivals is None:
        raise WorkloadError(
            f"{name} starts sessions at its own rate: scale it with --rate-scale (or {name}@xSCALE on a board)"
        )
    return spec.model_copy(update={"arrivals": arrivals.model_copy(update={"rate": rate * rate_scale})})


def check_options(num_requests: int | None = None, rate: float | None = None, **positive: float) -> None:
    """The CLI's workload numbers, checked before anything is built (``positive``: rate_scale, cv
    and start_offset by name; start_offset may be 0)."""
    if num_requests is not None and not 1 <= num_requests <= MAX_REQUESTS:
        raise WorkloadError(f"--num-requests must be between 1 and {MAX_REQUESTS:,}, got {num_requests:,}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"--rate must be a positive number of requests per second, got {rate}")
    for name, value in positive.items():
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "start_offset"):
            raise WorkloadError(
                f"--{name.replace('_', '-')} must be a finite "
                f"{'non-negative' if name == 'start_offset' else 'positive'} number, got {value}"
            )


_SPEC = TypeAdapter(SyntheticSpec | TraceWorkload)


def load_spec(path: Path, *, num_requests: int | None = None, seed: int = 0, rate_scale: float = 1.0) -> Workload:
    """A workload from a JSON spec (``{"kind": "synthetic", ...}`` or ``{"kind": "trace", "path": ...}``)."""
    if path.suffix != ".json":
        names = ", ".join(WORKLOAD_NAMES)
        raise WorkloadError(
            f"unknown workload {str(path)!r}; use one of {names}, a .json spec file or an inference-perf .yaml config"
        )
    data = read_json(path, "workload spec")
    if isinstance(data, dict) and data.get("kind") == "sessions":  # multi-turn chat sessions (workloads/sessions.py)
        from kvsched.workloads.sessions import session_spec

        return session_spec(data, path, num_requests, seed, rate_scale)
    if isinstance(data, dict) and data.get("kind") == "long-context":  # long-context sessions as block hashes
        from kvsched.workloads.long_context import LongContextSpec
        from kvsched.workloads.sessions import session_spec

        return session_spec(data, path, num_requests, seed, rate_scale, LongContextSpec)
    if isinstance(data, dict) and data.get("kind") == "prefix-trace":
        from kvsched.workloads.prefix_trace import prefix_spec

        return prefix_spec(data, path, num_requests, rate_scale)
    if isinstance(data, dict):
        data.setdefault("seed", seed)
        if data.get("kind") == "trace" and "path" in data:
            data["path"] = str((path.parent / data["path"]).resolve())  # relative to the spec file
    try:
        spec = _SPEC.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "")
        raise WorkloadError(
            f"invalid workload spec: {field}: {first['msg']}" if field else f"invalid workload spec: {first['msg']}",
            path,
        ) from None
    given: dict[str, Any] = {}  # what the command line changes, validated with the rest: it cannot pass a bound
    if num_requests is not None:
        given["num_requests" if isinstance(spec, SyntheticSpec) else "max_requests"] = num_requests
    if rate_scale != 1.0:
        if isinstance(spec, SyntheticSpec):
            given["arrivals"] = {**spec.arrivals.model_dump(), "rate": spec.arrivals.rate * rate_scale}
        else:
            given["rate_scale"] = spec.rate_scale * rate_scale
    if not given:
        return spec
    try:
        return type(spec).model_validate({**spec.model_dump(), **given})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "")
        raise WorkloadError(
            f"invalid workload spec with --num-requests and --rate-scale: {field}: {first['msg']}", path
        ) from None


__all__ = [
    "WORKLOAD_NAMES",
    "Workload",
    "WorkloadError",
    "SyntheticSpec",
    "TraceWorkload",
    "Poisson",
    "Gamma",
    "build_workload",
    "check_options",
    "load_spec",
    "builtin_path",
]

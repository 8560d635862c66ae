"""What a fleet is made of: replica groups (each its own policy, profile and engine settings, so a
fleet may be heterogeneous), their roles (co-located, or prefill and decode pools), the router, the
staleness of what it sees, and the KV transfer between pools. Written as JSON for ``--fleet``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvsched.cluster.replica import DECODE, MIXED, PREFILL, Replica, replica_class
from kvsched.cluster.transfer import DecodeExecutor, KvTransfer
from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.errors import KvschedError
from kvsched.executors.profiles import resolve_profile
from kvsched.executors.settings import check_names, fit_to_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.plugins.discovery import load_policy
from kvsched.userfiles.reader import read_json

MAX_REPLICAS = 4096  # replicas in a fleet, all groups together (--replicas takes as many)


class FleetError(KvschedError):
    """A fleet spec that cannot be built (one line on the command line)."""


class ReplicaGroup(BaseModel):
    """``count`` identical replicas: their role, policy, cost profile and engine settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(1, ge=1, le=MAX_REPLICAS)
    role: Literal["mixed", "prefill", "decode"] = MIXED
    policy: str = "vllm-default"
    policy_options: dict[str, Any] = Field(default_factory=dict)
    profile: str = "llama2-7b-a100"
    settings: dict[str, Any] = Field(default_factory=dict, description="EngineConfig fields, as --set gives them")


class FleetSpec(BaseModel):
    """A fleet: replica groups, the router (and its options), the staleness of the replicas' reports
    as the router sees them, and the prefill-to-decode KV transfer."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    replicas: list[ReplicaGroup] = Field(min_length=1, max_length=MAX_REPLICAS)
    router: Any = Field(
        "round-robin", description="an installed router's name, path/to/file.py:Class, or (in Python) a router object"
    )
    router_options: dict[str, Any] = Field(default_factory=dict)
    staleness_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="a view shows the newest report at least this old (0: the newest; an hour at most)",
    )
    transfer: KvTransfer = KvTransfer()

    @model_validator(mode="after")
    def _pools(self) -> FleetSpec:
        roles = {g.role for g in self.replicas}
        if roles != {MIXED} and roles != {PREFILL, DECODE}:
            raise ValueError("a fleet is all mixed replicas, or prefill and decode pools (both, and no mixed)")
        total = sum(g.count for g in self.replicas)
        if total > MAX_REPLICAS:
            raise ValueError(
                f"a fleet has at most {MAX_REPLICAS:,} replicas, all groups together; this one has {total:,}"
            )
        return self

    @property
    def disaggregated(self) -> bool:
        return self.replicas[0].role != MIXED

    def build(self) -> list[Replica]:
        """One engine per replica, named by role and place (replica-0, prefill-0, decode-3, ...)."""
        replicas, counters = [], {}
        for group in self.replicas:
            for _ in range(group.count):
                k = counters[group.role] = counters.get(group.role, -1) + 1
                name = f"{'replica' if group.role == MIXED else group.role}-{k}"
                replicas.append(_replica(name, group, self.staleness_s))
        for i, r in enumerate(replicas):
            r.index = i
        return replicas


def _replica(name: str, group: ReplicaGroup, staleness: float) -> Replica:
    check_names(group.settings, "settings")
    try:
        config = EngineConfig.model_validate(group.settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise FleetError(f"{name}: settings.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    profile = resolve_profile(group.profile)
    config = fit_to_profile(config, profile, load_policy(group.policy))
    executor = (DecodeExecutor if group.role == DECODE else SimulatedExecutor)(profile)
    engine = Engine(config, group.policy, executor, policy_options=group.policy_options or None)
    kind = replica_class(engine)
    return kind(name, group.role, engine, profile.name, staleness, steady_runs=group.role != DECODE)


def load_fleet(path: Path, **overrides: Any) -> FleetSpec:
    """A fleet spec from a JSON file (read as every file a user gives is: ``userfiles/reader.py``);
    ``overrides`` (router, staleness_s, ...) replace its fields when not None."""
    data = read_json(path, "the fleet spec")
    if not isinstance(data, dict):
        raise FleetError(f"{path}: a fleet spec is a JSON object with a 'replicas' list")
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f".{part}" if isinstance(part, str) else f"[{part}]" for part in first["loc"])
        raise FleetError(
            f"{path}: invalid fleet spec: {where.lstrip('.') + ': ' if where else ''}"
            f"{first['msg'].removeprefix('Value error, ')}"
        ) from None

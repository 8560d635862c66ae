"""Finding a cost profile by name (built in) or by path (a JSON file written by ``engine calibrate``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from kvsched.core.errors import KvschedError
from kvsched.core.files import read_json
from kvsched.executors.cost_model import PROFILES, CostProfile


class ProfileError(KvschedError):
    """The requested cost profile does not exist or its file is invalid."""


def resolve_profile(profile: str | Path | CostProfile) -> CostProfile:
    if isinstance(profile, CostProfile):
        return profile
    text = str(profile)
    if text in PROFILES:
        return PROFILES[text]
    path = Path(text)
    if path.suffix == ".json":
        try:
            return CostProfile.model_validate(read_json(path, "cost profile"))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ProfileError(f"{path}: invalid cost profile: {'.'.join(map(str, first['loc'])) or 'the whole file'}: {first['msg']}") from None
    raise ProfileError(f"unknown cost profile {text!r}; available: {', '.join(PROFILES)}, or a .json file from `engine calibrate`")

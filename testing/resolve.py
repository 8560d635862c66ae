"""Turn what a user typed after ``--policy`` into a policy object: an installed name, or a file or module target.

``path/to/file.py:Attr`` and ``package.module:Attr`` let an author check a policy before
packaging it (and let the test suite check deliberately broken ones).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from kvsched.core.errors import PolicyError, UnknownPolicyError, shorten


def resolve_policy(spec: str) -> tuple[str, Any]:
    """``(display name, policy object)`` for an entry-point name, ``file.py:Attr`` or ``module:Attr``."""
    if ":" not in spec:
        from kvsched.core.plugins import load_policy

        return spec, load_policy(spec)
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UnknownPolicyError(f"policy file {target!r} does not exist")
        module_name = f"kvsched_policy_file_{path.stem}"
        spec_obj = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec_obj)
        try:
            spec_obj.loader.exec_module(module)
        except Exception as exc:
            raise PolicyError(spec, f"the file fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UnknownPolicyError(f"cannot import policy module {target!r}: {exc}") from exc
        except Exception as exc:
            raise PolicyError(spec, f"the module fails to load: {type(exc).__name__}: {shorten(str(exc))}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UnknownPolicyError(f"{target!r} has no attribute {attr!r}") from None
    return getattr(obj, "name", None) or attr, obj

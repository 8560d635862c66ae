"""The allocators' per-block loops in C (allocators/_nameindex.c), where built, and whether they are in use.

The prefix cache's index and the pool's and the prompts' loops over blocks run in C where the module is built;
else, or with ``KVSCHED_DICT_INDEX`` set to anything but 0 or empty, the index is a dict and the loops are the
Python code beside each call, the reference the compiled ones are tested against (tests/test_nameindex.py).
"""

from __future__ import annotations

import os

try:
    from kvsched.allocators._nameindex import (
        NameIndex,
        count_held,
        forget_names,
        hold_refs,
        name_inside,
        register_names,
        release_refs,
    )
except ImportError:
    NameIndex = count_held = forget_names = hold_refs = name_inside = register_names = release_refs = None
COMPILED_INDEX = NameIndex is not None and os.environ.get("KVSCHED_DICT_INDEX", "0") in ("", "0")
# The loops outside the pool (BlockPrompt's naming, the block manager's count of held hits): in C exactly when the
# pools' index is compiled (the pools' own loops follow the type of their index)
name_inside, count_held = (name_inside, count_held) if COMPILED_INDEX else (None, None)


def index_in_use() -> str:
    """What ``engine policies`` says of the pools' index."""
    if COMPILED_INDEX:
        return "compiled (allocators/_nameindex.c)"
    return "a dict (KVSCHED_DICT_INDEX=1)" if NameIndex else "a dict (allocators/_nameindex.c is not built)"

"""Named workloads that ship inside the package (data and attribution in ``workloads/data/``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

DATA = "data"
BUILTIN_TRACES = {
    "azure-conv": "azure_conv_2023.csv",  # Azure LLM inference 2023, conversation; CC-BY 4.0
    "sharegpt": "sharegpt_8k_lengths.csv",  # ShareGPT length stats (Sarathi-Serve); Apache-2.0
}
# Named workload specs (JSON beside the traces): what the leaderboard's default workloads are made of.
BUILTIN_SPECS = {
    # ShareGPT's lengths, prompts cut to fit a 4,096-token context (Vidur's cut): none ignored
    "sharegpt-4k": "sharegpt_4k.json",
    # multi-turn sessions on 8 shared system prompts, each session an SLO tier
    "tiered-sessions": "tiered_sessions.json",
    "long-context": "long_context.json",  # long-context sessions as block hashes, Mooncake's conversation trace's shape
}
SHAREGPT_DEFAULT_RATE = 1.0  # req/s; ShareGPT requests are long (2.3k prompt, 440 output on average)


def is_trace(name: str) -> bool:
    """Whether a built-in name replays a trace's requests (a trace, or a named spec of one): the many-request kind."""
    import json

    return name in BUILTIN_TRACES or (
        name in BUILTIN_SPECS and json.loads(builtin_path(name).read_text()).get("kind") == "trace"
    )


def builtin_path(name: str) -> Path:
    """Where the named trace or spec is installed (inside the package, so it survives a wheel install)."""
    resource = files("kvsched.workloads").joinpath(DATA, BUILTIN_TRACES.get(name) or BUILTIN_SPECS[name])
    return Path(str(resource))

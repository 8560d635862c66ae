"""Named workloads that ship inside the package (data and attribution in ``workloads/data/``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

DATA = "data"
BUILTIN_TRACES = {
    "azure-conv": "azure_conv_2023.csv",  # Azure LLM inference 2023, conversation; CC-BY 4.0
    "sharegpt": "sharegpt_8k_lengths.csv",  # ShareGPT length stats (Sarathi-Serve); Apache-2.0
}
SHAREGPT_DEFAULT_RATE = 1.0  # req/s; ShareGPT requests are long (2.3k prompt, 440 output on average)


def builtin_path(name: str) -> Path:
    """Where the named trace is installed (inside the package, so it survives a wheel install)."""
    resource = files("kvsched.workloads").joinpath(DATA, BUILTIN_TRACES[name])
    return Path(str(resource))

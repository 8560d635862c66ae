"""``engine serve``: vLLM's OpenAI-compatible server with a kvsched policy as its scheduler.

The command checks what it can before vLLM starts (vLLM installed, the policy found, a policy with
valid hooks, its options accepted, the engine settings valid: the mirror the engine core builds, built
here first; the model folder there), then replaces itself with
vLLM's server (``integrations/vllm/server.py``; signals and exit codes are then vLLM's), its scheduler class
``kvsched.integrations.vllm.scheduler.KvschedScheduler``, the policy in the additional config, and the
front-end middleware that answers HTTP 400 to a request the policy's mirror would refuse (``frontend.py``).
Arguments after ``--`` go to vLLM unchanged (``engine serve --policy fcfs -- --max-num-seqs 8``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from typing import Annotated

import typer

from kvsched.cli.common import PolicyOpt, PolicyOptions, SetOpt, fail, parse_pairs

ServeModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="smollm2-135m, or a local model folder vLLM can load")
]
HostOpt = Annotated[str, typer.Option("--host", help="address to listen on")]
PortOpt = Annotated[int, typer.Option("--port", min=1, max=65535, help="port to listen on")]
KvCacheOpt = Annotated[
    float | None,
    typer.Option(
        "--kv-cache-gib",
        min=0.01,
        max=1_048_576,
        help="KV cache size on the CPU backend (default: $VLLM_CPU_KVCACHE_SPACE, else 1)",
    ),
]

METRICS_DIR = "KVSCHED_METRICS_DIR"  # the Prometheus folder engine serve made, which the server removes
# What vLLM needs on the CPU backend for the models this project ships (research/round2-anchors.md §7).
CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--block-size", "32")


def vllm_command(
    model_dir: str,
    served_name: str,
    host: str,
    port: int,
    extra: list[str],
    kvsched: dict | None = None,
    scheduler_cls: str | None = None,
) -> list[str]:
    """The ``vllm serve`` command line: vLLM's own scheduler, or with ``kvsched`` (the additional config)
    ``scheduler_cls`` (``KvschedScheduler`` unless given)."""
    command = [
        sys.executable,
        "-m",
        "kvsched.integrations.vllm.server",
        "--model",
        model_dir,
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        *CPU_ARGS,
    ]
    if kvsched is not None:
        from kvsched.integrations.vllm import FRONTEND_MIDDLEWARE, SCHEDULER_CLS

        scheduler_cls = scheduler_cls or SCHEDULER_CLS
        command += ["--scheduler-cls", scheduler_cls, "--additional-config", json.dumps({"kvsched": kvsched})]
        if scheduler_cls == SCHEDULER_CLS:  # a request the mirror would refuse gets a 400 from the front end
            command += ["--middleware", FRONTEND_MIDDLEWARE]
    return command + list(extra)


def server_env(base: dict[str, str], kv_cache_gib: float | None = None) -> dict[str, str]:
    """``base`` as vLLM's server needs it: offline, a CPU KV cache (``kv_cache_gib``, else
    $VLLM_CPU_KVCACHE_SPACE, else 1 GiB), and a fresh Prometheus multiprocess folder, so that
    /metrics also shows the counter the engine-core process keeps (named again in ``METRICS_DIR``: the
    server removes the folder as it exits)."""
    metrics = tempfile.mkdtemp(prefix="kvsched-metrics-")  # removed by the server as it exits (vllm/server.py)
    env = dict(base, HF_HUB_OFFLINE="1", PROMETHEUS_MULTIPROC_DIR=metrics, **{METRICS_DIR: metrics})
    if kv_cache_gib is not None or "VLLM_CPU_KVCACHE_SPACE" not in env:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_cache_gib or 1:g}"
    return env


def serve(
    ctx: typer.Context,
    policy: PolicyOpt = "vllm-v1",
    policy_opt: PolicyOptions = None,
    set_: SetOpt = None,
    model: ServeModelOpt = "smollm2-135m",
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    kv_cache_gib: KvCacheOpt = None,
) -> None:
    """Serve MODEL over vLLM's OpenAI-compatible API, scheduled by POLICY (any installed kvsched policy)."""
    from kvsched.core.config import EngineConfig
    from kvsched.integrations.vllm.mirror import Mirror, check_settings

    if importlib.util.find_spec("vllm") is None:
        fail("engine serve needs vLLM: pip install 'kvsched[vllm]' (make setup installs it)")
    options, settings = parse_pairs(policy_opt, "--policy-opt"), parse_pairs(set_, "--set")
    target, colon, attr = policy.rpartition(":")
    if colon and target.endswith(".py"):  # vLLM's engine-core process loads it: give it a path that works from anywhere
        policy = f"{os.path.abspath(target)}:{attr}"
    check_settings(settings)  # what vLLM owns (block_size, ...) would only fail in vLLM's engine core
    # The mirror vLLM's engine core builds, with V1's mechanics (vLLM's own numbers aside): what is not a policy (a
    # router's file, a hook of the wrong signature), an unknown one, a bad option or setting fails here in one line,
    # not in the engine core 25-130 s after vLLM starts, in a hundred lines of traceback.
    v1 = {"vllm_engine": "v1", "num_cpu_blocks": 0, "decode_lane": False}
    Mirror(EngineConfig.model_validate({**v1, **settings}), policy, options)
    from kvsched.executors.hf_models import model_folder

    model_dir = str(model_folder(model))
    env = server_env(os.environ, kv_cache_gib)
    kvsched = {"policy": policy, "options": options, "config": settings}
    command = vllm_command(model_dir, model, host, port, ctx.args, kvsched)
    sys.stdout.flush()
    try:
        os.execve(command[0], command, env)
    finally:  # reached only when the exec failed: the server that would have removed the folder never ran
        shutil.rmtree(env[METRICS_DIR], ignore_errors=True)

"""A Ray Serve application of real vLLM replicas behind a kvsched router.

Each replica of the ``EngineServe`` deployment owns one ``engine serve`` process (vLLM's OpenAI
server on the CPU backend, scheduled by a kvsched policy) and forwards completions to it; the
``Fleet`` ingress parses each request's body and calls the replicas through a deployment handle,
whose request router is ``KvschedRequestRouter`` (or any other ``RequestRouter`` class, e.g. Ray's
``PrefixCacheAffinityRouter``, to compare). Why not Ray Serve LLM's own ``LLMServer``: see the Ray
section of docs/cluster.md.

Every process a replica starts is in its own session and stopped with it: on ``shutdown`` (called
by ``stop_fleet``), when the actor object goes, and, if the actor is killed outright, by the
kernel's parent-death signal, which SIGTERMs vLLM's server, which stops its engine core.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig

ROUTER_CLASS = "kvsched.integrations.ray.router:KvschedRequestRouter"
APP = "kvsched-fleet"
_PR_SET_PDEATHSIG = 1


class CompletionBody:
    """A completion request's JSON body, with ``prompt`` as an attribute too, as text: Ray's own prefix router
    reads it so and compares characters, so a token-id prompt is given to it one character per token id
    (it would read a list of ids as no text at all); kvsched's router reads the body's ids themselves."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.prompt = body, body.get("prompt")
        if isinstance(self.prompt, list) and all(isinstance(t, int) and 0 <= t < 0x110000 for t in self.prompt):
            self.prompt = "".join(map(chr, self.prompt))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the replica's process goes, however it goes."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EngineServe:
    """One Serve replica: an ``engine serve`` process of its own, and completions forwarded to it."""

    def __init__(
        self,
        policy: str = "vllm-v1",
        model: str = "smollm2-135m",
        kv_cache_gib: int = 1,
        startup_s: float = 900.0,
        threads: int = 1,
        vllm_args: tuple[str, ...] = (),
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        engine = str(Path(sys.executable).with_name("engine"))
        command = [
            engine,
            "serve",
            "--policy",
            policy,
            "--model",
            model,
            "--port",
            str(self.port),
            "--kv-cache-gib",
            str(kv_cache_gib),
        ]
        if vllm_args:  # engine serve passes what follows -- to vLLM unchanged
            command += ["--", *vllm_args]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.log = tempfile.NamedTemporaryFile(prefix=f"kvsched-serve-{self.port}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.name = serve.get_replica_context().replica_id.unique_id
        deadline = time.monotonic() + startup_s
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=5)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.shutdown()
                    tail = Path(self.log.name).read_text(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"engine serve did not start on port {self.port} (exit {self.proc.returncode}); its log "
                        f"ends:\n{tail}"
                    ) from None
                time.sleep(2)
        import httpx

        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)

    def server_pid(self) -> int:
        return self.proc.pid

    async def complete(self, body: CompletionBody) -> tuple[str, int, Any]:
        """A non-streaming completion: (this replica's name, status, the server's JSON)."""
        reply = await self.client.post("/v1/completions", json=body.body)
        return self.name, reply.status_code, reply.json()

    async def stream(self, body: CompletionBody):
        """A streaming completion: the server's event-stream bytes as they come."""
        async with self.client.stream("POST", "/v1/completions", json=body.body) as reply:
            async for chunk in reply.aiter_raw():
                yield chunk

    def shutdown(self) -> None:
        """Stop the server's process group (vLLM's API server and its engine core) and wait for it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass

    def __del__(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None:
            self.shutdown()


api = FastAPI()


@serve.ingress(api)
class Fleet:
    """The fleet's one URL: OpenAI completions, each routed to a replica by the deployment's request router."""

    def __init__(self, replicas, model: str = "smollm2-135m") -> None:
        self.replicas, self.model = replicas, model

    @api.get("/health")
    async def health(self) -> dict:
        return {}

    @api.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "kvsched"}]}

    @api.post("/v1/completions")
    async def completions(self, request: HttpRequest):
        try:
            payload = await request.json()
        except (ValueError, RecursionError):  # not JSON, or nested past what the parser takes
            payload = None
        if not isinstance(payload, dict):  # refused here, as a server refuses it, not a 500 from a replica's call
            refusal = {"object": "error", "message": "the body must be a JSON object", "type": "BadRequestError"}
            return JSONResponse({**refusal, "param": None, "code": 400}, status_code=400)
        body = CompletionBody(payload)
        if body.body.get("stream"):
            chunks = self.replicas.options(stream=True, method_name="stream").remote(body)
            return StreamingResponse(chunks, media_type="text/event-stream")
        name, status, reply = await self.replicas.complete.remote(body)
        return JSONResponse(reply, status_code=status, headers={"x-kvsched-replica": name})


def build_fleet(
    replicas: int = 2,
    router: str = "prefix-affinity",
    router_options: dict | None = None,
    policy: str = "vllm-v1",
    model: str = "smollm2-135m",
    kv_cache_gib: int = 1,
    router_class: str = ROUTER_CLASS,
    router_kwargs: dict | None = None,
    vllm_args: tuple[str, ...] = (),
):
    """The application: ``replicas`` EngineServe replicas behind ``router`` (a kvsched router's name;
    ``router_class``/``router_kwargs`` for another Serve request router instead); ``vllm_args`` go to each
    replica's vLLM (``engine serve ... -- ARGS``)."""
    kwargs = router_kwargs if router_kwargs is not None else {"router": router, "router_options": router_options or {}}
    backend = serve.deployment(
        EngineServe,
        name="EngineServe",
        num_replicas=replicas,
        max_ongoing_requests=64,
        ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(request_router_class=router_class, request_router_kwargs=kwargs),
    )
    ingress = serve.deployment(Fleet, name="Fleet", ray_actor_options={"num_cpus": 0})
    return ingress.bind(backend.bind(policy, model, kv_cache_gib, vllm_args=tuple(vllm_args)), model)


def start_fleet(port: int, **fleet: Any) -> str:
    """Run the fleet on Serve's HTTP proxy at ``port`` (on the Ray ``ray.init`` started or joined); its base URL.

    Serve waits a fixed 60 s for its first proxy, and its controller replaces a proxy slow to
    answer (the first one's wait then fails); on a loaded machine either happens, so it connects
    to the controller already made, which keeps a proxy running, and the proxy is waited for by
    the caller's health check (the base URL answers once it is up)."""
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    except (TimeoutError, RayActorError):
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_fleet(**fleet), name=APP, route_prefix="/", blocking=False)
    return f"http://127.0.0.1:{port}/v1"


def wait_ready(url: str, timeout: float = 900.0, model: str = "smollm2-135m") -> None:
    """Until a completion comes back through the fleet at ``url`` (Serve deploys the replicas in the background)."""
    import openai

    deadline = time.monotonic() + timeout
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as client:
        while True:
            try:
                client.completions.create(model=model, prompt=[1000, 1001, 1002], max_tokens=1)
                return
            except openai.APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(5)


def stop_fleet() -> None:
    """Stop the application and Serve: each replica's ``__del__`` (Serve calls it on a graceful
    shutdown) stops its server; a replica killed outright takes its server down by the parent-death signal."""
    serve.shutdown()

"""vLLM front-end middleware: a request kvsched's mirror would refuse gets HTTP 400 before it reaches the engine core.

Give it to vLLM's server as ``--middleware kvsched.integrations.vllm.frontend.CheckKvschedFields``
(``engine serve`` does). A client's ``priority`` and ``vllm_xargs`` labels (tenant, session_id, slo_class) are checked by the same
rule the mirror applies (``mirror.request_fields``). Without the middleware such a request still
cannot stop the server: the scheduler fails it alone (its client gets an HTTP 500).
"""

from __future__ import annotations

import json
from typing import Any

from kvsched.integrations.vllm.mirror import RefusedField, request_fields


def refusal(body: bytes) -> RefusedField | None:
    """Why kvsched refuses a JSON request ``body``, or None; what is not a JSON object is vLLM's to judge."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or ("priority" not in data and "vllm_xargs" not in data):
        return None
    extra = data.get("vllm_xargs")
    try:
        request_fields(data.get("priority", 0), extra if isinstance(extra, dict) else None)
    except RefusedField as exc:
        return exc
    return None


class CheckKvschedFields:
    """Pure ASGI middleware: reads a POSTed JSON body, answers 400 for a field kvsched refuses, else passes it on intact."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = dict(scope.get("headers") or ()).get(b"content-type", b"json")  # FastAPI reads a body without one as JSON
        if scope["type"] != "http" or scope.get("method") != "POST" or b"json" not in kind:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        reason = refusal(body)
        if reason is not None:
            from starlette.responses import JSONResponse
            from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

            error = create_error_response(f"kvsched refuses this request: {reason}", param=reason.field)
            return await JSONResponse(error.model_dump(), status_code=400)(scope, receive, send)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the client's disconnect, as vLLM's streaming responses wait for it

        await self.app(scope, replay, send)

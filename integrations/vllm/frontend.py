"""vLLM front-end middleware: a request kvsched's mirror would refuse gets HTTP 400 before it reaches the engine core.

Give it to vLLM's server as ``--middleware kvsched.integrations.vllm.frontend.CheckKvschedFields``
(``engine serve`` does). A client's ``priority`` and ``vllm_xargs`` labels (tenant, session_id, slo_class) are checked
by the same rule the mirror applies (``mirror.request_fields``), whatever the body's Content-Type says
(``Application/JSON``, a charset, none at all) but a form's; a body nested past what the JSON parser
takes is a 400 too. Without the middleware such a request still cannot stop the server: the
scheduler fails it alone (its client gets an HTTP 500).
"""

from __future__ import annotations

import json
from typing import Any

from kvsched.integrations.vllm.mirror import RefusedField, request_fields

FORMS = (b"multipart/form-data", b"application/x-www-form-urlencoded")  # bodies no endpoint reads as JSON


def refusal(body: bytes) -> RefusedField | None:
    """Why kvsched refuses a JSON request ``body``, or None; what is not JSON is vLLM's to judge. JSON nested
    past what Python's parser takes is refused too: vLLM's own parsing of it would fail (HTTP 500)."""
    try:
        data = json.loads(body)
    except RecursionError:
        return RefusedField("body", "JSON nested too deeply")
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


def content_type(scope: dict) -> bytes:
    """The request's media type, lower case without parameters (``Application/JSON; charset=utf-8`` is
    ``application/json``), from its first Content-Type header as Starlette reads it; empty without one."""
    value = next((v for k, v in scope.get("headers") or () if k.lower() == b"content-type"), b"")
    return value.split(b";", 1)[0].strip().lower()


class CheckKvschedFields:
    """Pure ASGI middleware: reads a POSTed body (any but a form's: vLLM reads JSON whatever the Content-Type
    says, or with none), answers 400 for a field kvsched refuses, else passes it on intact."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or content_type(scope) in FORMS:
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

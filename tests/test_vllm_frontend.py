"""engine serve's front-end check over ASGI (Starlette's test client): every body an endpoint could read as JSON
is checked, whatever its Content-Type says, and one no parser can read is a 400, not the endpoint's 500.

The application behind the middleware reads each POSTed body as JSON, as Starlette's ``request.json()``
(and vLLM behind it) does whatever the header; tests/test_vllm_serve.py sends the same bodies to vLLM itself.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vLLM (the vllm extra) is not installed")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from kvsched.integrations.vllm.frontend import CheckKvschedFields  # noqa: E402

HOSTILE = json.dumps({"prompt": "Hi", "priority": 2**40}).encode()
DEEP = b"[" * 2000 + b"]" * 2000  # past what Python's JSON parser takes (a RecursionError, once an HTTP 500)


async def completions(request: Request) -> JSONResponse:
    body = await request.body()
    if request.headers.get("content-type", "").startswith("multipart/"):
        return JSONResponse({"form": len(body)})
    return JSONResponse({"priority": (await request.json()).get("priority")})


@pytest.fixture(scope="module")
def client():
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    return TestClient(CheckKvschedFields(app), raise_server_exceptions=False)


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "Application/JSON",
        "APPLICATION/JSON; charset=utf-8",
        "application/json;charset=UTF-8",
        "text/plain",
        "application/vnd.api+json",
    ],
)
def test_a_field_kvsched_refuses_is_a_400_whatever_the_content_type_says(client, content_type):
    """Another case or a charset once skipped the check: the engine core failed the request (HTTP 500)."""
    headers = {"content-type": content_type} if content_type else {}
    answer = client.post("/v1/completions", content=HOSTILE, headers=headers)
    assert answer.status_code == 400 and "kvsched refuses this request: priority:" in answer.text, answer.text


def test_a_body_nested_past_the_parser_is_a_400(client):
    answer = client.post("/v1/completions", content=DEEP, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "body: JSON nested too deeply" in answer.text, answer.text


def test_what_kvsched_takes_and_forms_pass_unchanged(client):
    fine = client.post(
        "/v1/completions",
        content=json.dumps({"prompt": "Hi", "priority": 3}).encode(),
        headers={"content-type": "Application/JSON"},
    )
    assert fine.status_code == 200 and fine.json() == {"priority": 3}
    form = client.post("/v1/completions", files={"file": ("a.wav", b"\x00" * 100)})
    assert form.status_code == 200 and form.json()["form"] > 100

"""A request's labels (tenant, session, SLO class) reach a policy inside vLLM as they do in simulation:
``engine bench`` sends them in ``vllm_xargs``, the mirror takes them, the front end refuses a bad one."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvsched.core.request import Request, SamplingParams
from kvsched.experiments.bench import Sent, _send

pytest.importorskip("vllm", reason="vLLM (the vllm extra) is not installed")
from kvsched.integrations.vllm.frontend import refusal  # noqa: E402
from kvsched.integrations.vllm.mirror import RefusedField, request_fields  # noqa: E402


def test_the_mirror_takes_session_and_slo_class_from_vllm_xargs():
    fields = request_fields(2, {"tenant": "gold", "session_id": "chat-7", "slo_class": "interactive", "other": 1})
    assert fields == {"priority": 2, "tenant": "gold", "session_id": "chat-7", "slo_class": "interactive"}
    assert request_fields(0, None) == {"priority": 0, "tenant": "default", "session_id": None, "slo_class": None}


@pytest.mark.parametrize("name", ["session_id", "slo_class", "tenant"])
def test_a_blank_label_is_refused_naming_its_field(name):
    with pytest.raises(RefusedField) as caught:
        request_fields(0, {name: "  "})
    assert caught.value.field == f"vllm_xargs.{name}"
    assert refusal(json.dumps({"prompt": "x", "vllm_xargs": {name: ""}}).encode()).field == f"vllm_xargs.{name}"


class _Recording:
    """An openai client stand-in that keeps what ``engine bench`` would send and fails the call."""

    def __init__(self) -> None:
        self.sent: dict = {}
        self.completions = self

    async def create(self, **kwargs):
        self.sent = kwargs
        raise ConnectionError("not a server")


def test_engine_bench_sends_the_labels_a_policy_reads():
    client = _Recording()
    request = Request(
        request_id="r",
        prompt_len=4,
        tenant="gold",
        session_id="chat-7",
        slo_class="batch",
        sampling=SamplingParams(max_tokens=2),
    )
    asyncio.run(_send(client, "m", Sent(request), 0.0, 60.0))
    assert client.sent["extra_body"]["vllm_xargs"] == {"tenant": "gold", "session_id": "chat-7", "slo_class": "batch"}
    asyncio.run(_send(client, "m", Sent(Request(request_id="q", prompt_len=4)), 0.0, 60.0))
    assert "vllm_xargs" not in client.sent["extra_body"]

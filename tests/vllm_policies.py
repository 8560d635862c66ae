"""Policies the vLLM integration tests load by file path (not a test module)."""

from kvsched import hookimpl
from kvsched.policies.vllm_v1 import VllmV1


class RaisesEveryThirdStep(VllmV1):
    """vllm-v1, except that every third step its select_batch raises: the engine must not notice."""

    name = "raises-every-third-step"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @hookimpl
    def select_batch(self, step):
        self.calls += 1
        if self.calls % 3 == 0:
            raise RuntimeError("a bug in the policy")
        return super().select_batch(step)


class RecordsWhatItSees(VllmV1):
    """vllm-v1 that writes each request's id, priority and tenant to ``path`` when it first sees it,
    raises in any step where a request of tenant ``boom`` waits, and in ``on_step`` after any step
    that ran a request of tenant ``boom-on-step``."""

    name = "records-what-it-sees"

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.seen: set[str] = set()

    @hookimpl
    def select_batch(self, step):
        with open(self.path, "a") as f:
            for group in step.waiting:
                if group.request_id not in self.seen:
                    self.seen.add(group.request_id)
                    f.write(f"{group.request_id} {group.priority} {group.tenant}\n")
        if any(group.tenant == "boom" for group in step.waiting):
            raise RuntimeError("boom")
        return super().select_batch(step)

    @hookimpl
    def on_step(self, report):
        if any(s.group.tenant == "boom-on-step" for s in report.output.scheduled):
            raise RuntimeError("boom after the step")


class PolicyExit(BaseException):
    """Not an ``Exception``: no hook call catches it, so it escapes the policy's step."""


class ExitsOnTenant(VllmV1):
    """vllm-v1 that raises ``PolicyExit`` in any step where a request of tenant ``exit`` waits."""

    name = "exits-on-tenant"

    @hookimpl
    def select_batch(self, step):
        if any(group.tenant == "exit" for group in step.waiting):
            raise PolicyExit("a policy that escapes its hook call")
        return super().select_batch(step)

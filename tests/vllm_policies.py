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

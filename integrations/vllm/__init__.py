"""kvsched policies inside vLLM V1: ``--scheduler-cls kvsched.integrations.vllm.scheduler.KvschedScheduler``.

Importing this package needs vLLM (``pip install 'kvsched[vllm]'``); nothing else in kvsched does.
"""

SCHEDULER_CLS = "kvsched.integrations.vllm.scheduler.KvschedScheduler"
FRONTEND_MIDDLEWARE = "kvsched.integrations.vllm.frontend.CheckKvschedFields"

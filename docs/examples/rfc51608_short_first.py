"""An RFC #51608 policy, written only with the RFC's extension points, run by kvsched's adapter.

    engine run --policy docs/examples/rfc51608_short_first.py:ShortFirst
    engine check --policy docs/examples/rfc51608_short_first.py:ShortFirst

Filter: while anything runs, a prompt longer than a quarter of the step's token budget waits until
it has waited 2 s (with nothing running it is tried at once: idle steps do not move the clock).
Score: shorter prompts first, plus one point per second waited. Preemption key: the running
request with the fewest computed tokens (least-computed-first) has the largest key.
"""

from kvsched.rfc51608 import Reject, Rfc51608


def long_prompts_wait(request, state):
    waited = state.now - request.arrival_time
    if state.num_running_requests and request.prompt_len > state.token_budget // 4 and waited < 2.0:
        return Reject(f"{request.prompt_len}-token prompt, waited {waited:.1f} s of 2")
    return None


def short_prompt(request, state):
    return -request.prompt_len / state.block_size


def waited(request, state):
    return state.now - request.arrival_time


def least_computed(request, running_position):
    return -request.num_computed_tokens


class ShortFirst(Rfc51608):
    """Short prompts first, long ones held back for 2 s, least-computed-first victims (RFC #51608 plugins)."""

    name = "rfc51608-short-first"
    claims = frozenset({"starvation-free"})
    filters = (long_prompts_wait,)
    scorers = ((short_prompt, 1.0), (waited, 1.0))
    preemption_key = staticmethod(least_computed)

"""kvsched-priority-vip: a priority scheduling policy with a VIP tier and aging, as an installable plugin."""

from kvsched_priority_vip.policy import PriorityVip

__all__ = ["PriorityVip"]

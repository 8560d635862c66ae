"""The three answers to "can this group's prompt be placed on the GPU?"."""

from enum import Enum


class AllocStatus(str, Enum):
    OK = "ok"  # fits now, above the watermark
    LATER = "later"  # would fit once running groups free blocks
    NEVER = "never"  # larger than the whole pool minus the watermark: it can never run

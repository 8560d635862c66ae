"""What runs a scheduled step: the simulator (cost models, profiles, calibration) and real transformers models.

The contract they implement, ``kvsched.core.executor``, lives in the core; nothing in the core
imports this package.
"""

from kvsched.executors.cost_model import CostProfile
from kvsched.executors.simulated import SimulatedExecutor

__all__ = ["CostProfile", "SimulatedExecutor"]

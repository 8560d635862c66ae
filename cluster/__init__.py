"""A fleet of engines behind a router, on one global virtual clock (P/D pools optional)."""

from kvsched.cluster.loop import Cluster, run_cluster
from kvsched.cluster.records import FleetRecords
from kvsched.cluster.spec import FleetError, FleetSpec, ReplicaGroup, load_fleet
from kvsched.cluster.transfer import KvTransfer

__all__ = [
    "Cluster",
    "FleetError",
    "FleetRecords",
    "FleetSpec",
    "KvTransfer",
    "ReplicaGroup",
    "load_fleet",
    "run_cluster",
]

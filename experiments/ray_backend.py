"""A sweep's grid points as Ray tasks, for a grid that outgrows one machine's process pool.

The same ``run_point`` runs each point, on the same picklable ``SweepSpec``, so a row is the same
whichever backend ran it (only ``wall_s``, the point's own wall time, differs from run to run, as it
does between two process-pool runs). Without an address the sweep starts a local Ray of ``workers``
CPUs and stops it at the end; with one (``ray://host:10001``, ``auto`` or a GCS ``host:port``) it
connects to that cluster, whose nodes must have the same kvsched installed, and leaves it running.
An already initialized Ray (a test's, a notebook's) is used as it is.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

from kvsched.errors import error_text, shorten

LOCAL = "local"  # the address that means "start a Ray of our own on this machine"

# Waits a node we start gives its own processes, longer than Ray's defaults, for a loaded machine
# (seen at load 5-40 on 2 cores): the raylet aborted when its agents had not written their ports
# ("Timed out waiting for file .../metrics_agent_port"), and Serve's controller killed an HTTP proxy
# that had not answered its 5 s ready check three times. A value the user set is kept.
LOADED_MACHINE_ENV = {"RAY_agent_register_timeout_ms": "300000", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}


DEFAULT_CONNECT_TIMEOUT_S = 60.0  # for a cluster at an address to answer (engine sweep --ray-timeout)
# Connects to the cluster at sys.argv[1] and leaves: run in a child process, which a deadline can end
# (Ray itself keeps retrying an address where no Ray answers for minutes, in code no signal reaches).
_PROBE = "import sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); ray.shutdown()"


def _ray():
    """The ray module; one line where it cannot be imported (not installed, or its import raises or exits)."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs the ray package: pip install 'kvsched[ray]' (or make setup)") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a broken install: its SystemExit(0) would end the sweep with no results and exit 0
        raise ValueError(f"--ray: the ray package fails to import: {type(exc).__name__}: {error_text(exc)}") from None
    return ray


def check_reachable(address: str, timeout: float) -> None:
    """Raise ``ValueError`` unless a Ray cluster answers at ``address`` within ``timeout`` seconds: first a
    TCP connection to its host and port (nothing listening fails at once), then a connection as Ray makes
    it, in a child process ended at the deadline. ``auto`` and a local Ray need no check."""
    import socket
    import subprocess
    import sys
    from urllib.parse import urlsplit

    if address in (LOCAL, "auto", ""):
        return
    where = urlsplit("//" + address.removeprefix("ray://"))
    try:
        host, port = where.hostname, where.port
    except ValueError:  # a port that is no number: Ray's own message says more
        host = port = None
    if host is not None and port is not None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            raise ValueError(
                f"--ray-address {address}: nothing answers at {host}:{port} ({exc.strerror or exc}): "
                "is a Ray cluster running there?"
            ) from None
    try:
        probe = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ValueError(
            f"--ray-address {address}: no Ray cluster answered within {timeout:g} s (--ray-timeout)"
        ) from None
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {probe.returncode}"
        raise ValueError(f"--ray: {address}: Ray could not start or connect: {shorten(last.strip(), 300)}")


def start_ray(address: str = "local", attempts: int = 3, **options: Any) -> None:
    """``ray.init``, tried again when a local node misses Ray's fixed 30 s startup wait (a loaded
    machine: the raylet registers late); any other failure is one line naming the address."""
    ray = _ray()
    if address == LOCAL:
        for name, value in LOADED_MACHINE_ENV.items():  # the processes ray.init spawns read them
            os.environ.setdefault(name, value)
    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # Ray Client's own timeout warning: the error line says it
                warnings.simplefilter("ignore", UserWarning)
                ray.init(address=address, **options)
            return
        except Exception as exc:  # Ray raises a bare Exception for the startup timeout
            ray.shutdown()
            if "timed out during startup" in str(exc) and address == LOCAL and attempt + 1 < attempts:
                continue
            where = "a local Ray" if address == LOCAL else address
            raise ValueError(
                f"--ray: {where}: Ray could not start or connect: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from None


def run_points_on_ray(
    spec,
    points: list,
    run_point: Callable,
    address: str | None = None,
    workers: int | None = None,
    on_done: Callable[[dict], None] | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """``run_point(spec, point)`` for every point as one Ray task each; rows in grid order. A cluster at
    ``address`` must answer within ``connect_timeout`` seconds (``check_reachable``)."""
    from kvsched.experiments.worker_errors import WorkerDied

    ray = _ray()
    started = not ray.is_initialized()
    if started:
        local = address in (None, "", LOCAL)
        if not local:
            check_reachable(address, connect_timeout)
        options: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        if local:
            options["num_cpus"] = max(1, min(workers or os.cpu_count() or 1, len(points)))
        start_ray(LOCAL if local else address, **options)
    pending: list = []
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_point)
        spec_ref = ray.put(spec)  # one copy of the workload's description in the object store, not one per task
        refs = {task.remote(spec_ref, point): i for i, point in enumerate(points)}
        rows: dict[int, dict] = {}
        pending = list(refs)
        while pending:  # rows as they finish (the progress bar), never one ray.get per task in order
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    row = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # the point's own error (run_point's portable one)
                    raise exc.cause if isinstance(exc.cause, BaseException) else exc from None
                except ray.exceptions.RayError:  # its worker died (os._exit, a crash, no memory): no error of its own
                    raise WorkerDied([points[refs[ref]].label]) from None
                rows[refs[ref]] = row
                if on_done:
                    on_done(row)
        return [rows[i] for i in range(len(points))]
    finally:
        if started:
            ray.shutdown()  # stops our local Ray, and with it any task still running
        else:
            for ref in pending:  # a cluster we joined keeps running: what we leave behind is cancelled
                ray.cancel(ref)

"""Starting or joining Ray for a rollout, quietly and without writing to ``$HOME``.

``rollout.ray_address=null`` (the default) starts a fresh instance for this run only: small-machine
settings, no dashboard, a random per-run auth token in the environment (no token file in
``~/.ray``), every server listening on 127.0.0.1 only, and a node that stops answering declared
dead within ``rollout.node_timeout_s`` (:func:`health_check_config`). ``auto`` joins the cluster
``ray start`` recorded on this machine, ``host:port`` that one (with the settings it was started
with).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator

__all__ = ["NODE_HEALTH_CHECKS", "health_check_config", "init_ray", "local_token_auth"]

log = logging.getLogger(__name__)

_OBJECT_STORE_MIB = 100  # a local instance's object store
#: Failed health checks in a row after which Ray declares a node dead.
NODE_HEALTH_CHECKS = 3


def health_check_config(node_timeout_s: float | None) -> dict[str, int]:
    """Ray's node health-check settings (``_system_config``) that declare a node dead within
    ``node_timeout_s`` seconds of its last answer, even when it answers nothing at all (a frozen
    machine: each check waits its timeout): :data:`NODE_HEALTH_CHECKS` checks in a row, each one
    period apart and given as long to answer. None: {} (Ray's defaults, about 65 s).

    Example:
        >>> health_check_config(30)
        {'health_check_failure_threshold': 3, 'health_check_period_ms': 5000, \
'health_check_timeout_ms': 5000}
        >>> health_check_config(None)
        {}
    """
    if node_timeout_s is None:
        return {}
    step_ms = max(1, math.floor(node_timeout_s * 1000 / (2 * NODE_HEALTH_CHECKS)))
    return {
        "health_check_failure_threshold": NODE_HEALTH_CHECKS,
        "health_check_period_ms": step_ms,
        "health_check_timeout_ms": step_ms,
    }


def local_token_auth() -> None:
    """Token authentication for a local instance this process starts, with a random token in
    the environment (inherited by Ray's processes): Ray neither warns nor writes
    ``~/.ray/auth_token``. A ``RAY_AUTH_MODE`` already set is left as it is."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    try:
        # Ray caches its auth settings at first use (an earlier `import ray` may have read
        # them): refresh them as Ray's own token set-up does, or the driver keeps the old mode
        # while the processes it starts use the new one.
        from ray._raylet import (  # type: ignore[attr-defined]  # compiled, no stubs
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # another Ray version: leave Ray its own defaults
        del os.environ["RAY_AUTH_MODE"], os.environ["RAY_AUTH_TOKEN"]


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While a local instance starts, its node address is 127.0.0.1: Ray's servers (GCS,
    raylet, every worker's) then listen on the loopback interface only, where they otherwise
    listen on all. Ray gives a node 127.0.0.1 only where it does not build clusters (macOS,
    Windows), and turns an explicit ``_node_ip_address="127.0.0.1"`` into this machine's outward
    address: that switch is set for the start, then restored. Another Ray version without it
    starts as Ray chooses."""
    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - Ray's layout changed
        yield
        return
    before = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if before is None:  # pragma: no cover - Ray's layout changed
        log.warning("Ray: this version's servers listen on every interface (no loopback switch)")
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def init_ray(
    address: str | None = None, num_cpus: int | None = None, node_timeout_s: float | None = 30.0
) -> bool:
    """Start a local Ray instance with small-machine settings, or join a cluster by address
    (``"auto"`` finds a running one). Returns True when this call started or joined Ray (the
    caller shuts it down), False when Ray was already up. The process's SIGTERM handler is
    kept (Ray's own would exit at once, before the run's outputs are written).

    Args:
        address: ``rollout.ray_address`` (None or ``"local"``: a local instance).
        num_cpus: a local instance's CPUs (None: this machine's).
        node_timeout_s: ``rollout.node_timeout_s``, for a local instance
            (:func:`health_check_config`).
    """
    import ray

    if ray.is_initialized():
        return False
    main = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        _start(None if address == "local" else address, num_cpus, node_timeout_s)
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if on_sigterm is None else on_sigterm)
    return True


def _start(address: str | None, num_cpus: int | None, node_timeout_s: float | None) -> None:
    import ray

    # Ray's start takes seconds (20 to 60 on a loaded machine) and prints nothing meanwhile.
    t0 = time.perf_counter()
    if address:
        log.info("Ray: joining the cluster at rollout.ray_address=%s ...", address)
        ray.init(address=address, log_to_driver=False)
        ctx = ray.get_runtime_context()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log.info(
            "Ray: joined the cluster at %s (rollout.ray_address=%s) in %.1f s: %d nodes, %g CPUs "
            "(its node health check is the one it was started with; rollout.node_timeout_s "
            "applies to a local instance)",
            ctx.gcs_address, address, time.perf_counter() - t0, len(nodes),
            ray.cluster_resources().get("CPU", 0),
        )  # fmt: skip
        return
    local_token_auth()
    cpus = num_cpus or os.cpu_count() or 1
    log.info(
        "Ray: starting a local instance (num_cpus=%d, object store %d MiB, no dashboard, on "
        "127.0.0.1, node timeout %s s; rollout.ray_address=null) ...",
        cpus, _OBJECT_STORE_MIB, node_timeout_s,
    )  # fmt: skip
    with loopback_only():
        ray.init(
            # "local": always a new instance, never a cluster some earlier `ray start` left.
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=_OBJECT_STORE_MIB * 2**20,
            log_to_driver=False,
            _system_config=health_check_config(node_timeout_s),
        )
    log.info(
        "Ray: started a local instance with %d CPUs in %.1f s (rollout.ray_address=null)",
        cpus, time.perf_counter() - t0,
    )  # fmt: skip

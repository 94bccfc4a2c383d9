"""Starting or joining Ray for a rollout, quietly and without writing to ``$HOME``.

``rollout.ray_address=null`` (the default) starts a fresh instance for this run only: small-machine
settings, no dashboard, a random per-run auth token in the environment (no token file in
``~/.ray``). ``auto`` joins the cluster ``ray start`` recorded on this machine, ``host:port`` that
one.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time

__all__ = ["init_ray", "local_token_auth"]

log = logging.getLogger(__name__)

_OBJECT_STORE_MIB = 100  # a local instance's object store


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


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start a local Ray instance with small-machine settings, or join a cluster by address
    (``"auto"`` finds a running one). Returns True when this call started or joined Ray (the
    caller shuts it down), False when Ray was already up. The process's SIGTERM handler is
    kept (Ray's own would exit at once, before the run's outputs are written)."""
    import ray

    if ray.is_initialized():
        return False
    main = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        _start(address, num_cpus)
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if on_sigterm is None else on_sigterm)
    return True


def _start(address: str | None, num_cpus: int | None) -> None:
    import ray

    # Ray's start takes seconds (20 to 60 on a loaded machine) and prints nothing meanwhile.
    t0 = time.perf_counter()
    if address:
        log.info("Ray: joining the cluster at rollout.ray_address=%s ...", address)
        ray.init(address=address, log_to_driver=False)
        ctx = ray.get_runtime_context()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log.info(
            "Ray: joined the cluster at %s (rollout.ray_address=%s) in %.1f s: %d nodes, %g CPUs",
            ctx.gcs_address, address, time.perf_counter() - t0, len(nodes),
            ray.cluster_resources().get("CPU", 0),
        )  # fmt: skip
        return
    local_token_auth()
    cpus = num_cpus or os.cpu_count() or 1
    log.info(
        "Ray: starting a local instance (num_cpus=%d, object store %d MiB, no dashboard; "
        "rollout.ray_address=null) ...", cpus, _OBJECT_STORE_MIB,
    )  # fmt: skip
    ray.init(
        # "local": always a new instance, never a cluster some earlier `ray start` left.
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        object_store_memory=_OBJECT_STORE_MIB * 2**20,
        log_to_driver=False,
    )
    log.info(
        "Ray: started a local instance with %d CPUs in %.1f s (rollout.ray_address=null)",
        cpus, time.perf_counter() - t0,
    )  # fmt: skip

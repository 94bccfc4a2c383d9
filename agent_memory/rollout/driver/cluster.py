"""Starting or joining Ray for a rollout, quietly and without writing to ``$HOME``.

``rollout.ray_address=null`` starts an instance for this run only: small-machine settings, no
dashboard, a private 0700 directory (sockets, logs, a random auth token; removed at the end),
servers on 127.0.0.1 only, dead nodes declared within ``rollout.node_timeout_s`` and a reaper
(:mod:`~agent_memory.rollout.driver.reaper`). ``auto`` joins the cluster ``ray start`` recorded
here, ``host:port`` that one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from agent_memory.rollout.driver.reaper import MARKER, Reaper

__all__ = [
    "NODE_HEALTH_CHECKS",
    "health_check_config",
    "init_ray",
    "local_token_auth",
    "stop_ray",
]

log = logging.getLogger(__name__)

_OBJECT_STORE_MIB = 100  # a local instance's object store
#: The reapers of the local instances this process started (:func:`stop_ray` releases them).
_REAPERS: list[Reaper] = []
#: Failed health checks in a row after which Ray declares a node dead.
NODE_HEALTH_CHECKS = 3


def health_check_config(node_timeout_s: float | None) -> dict[str, int]:
    """Ray's health-check settings (``_system_config``) that declare a node dead within
    ``node_timeout_s`` of its last answer, even a frozen one: :data:`NODE_HEALTH_CHECKS` checks,
    each one period apart and given as long. None: {} (Ray's defaults, about 65 s).

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


def local_token_auth(root: str | None = None) -> None:
    """Token authentication with a random token for a local instance: in ``root/auth_token``
    (0600, via ``RAY_AUTH_TOKEN_PATH``) when ``root`` is given, else in the environment; nothing
    in ``~/.ray``. A ``RAY_AUTH_MODE`` set by someone else is left as it is."""
    if "RAY_AUTH_MODE" in os.environ and not _AUTH_SET:
        return
    for key in _AUTH_SET:  # an earlier instance's token (its file may be gone)
        os.environ.pop(key, None)
    _AUTH_SET[:] = ["RAY_AUTH_MODE"]
    if root is None:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        _AUTH_SET.append("RAY_AUTH_TOKEN")
    else:
        path = os.path.join(root, "auth_token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        os.environ["RAY_AUTH_TOKEN_PATH"] = path
        _AUTH_SET.append("RAY_AUTH_TOKEN_PATH")
    os.environ["RAY_AUTH_MODE"] = "token"
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
        for key in _AUTH_SET:
            del os.environ[key]
        _AUTH_SET.clear()


#: The environment variables :func:`local_token_auth` set (it replaces them at the next start).
_AUTH_SET: list[str] = []


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While a local instance starts, its node address is 127.0.0.1, so Ray's servers listen on
    the loopback only (an explicit ``_node_ip_address`` would be made outward): Ray's switch for
    that (its macOS/Windows one) is set for the start, then restored; without it, Ray chooses."""
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
    """Start a local Ray instance or join a cluster by address (``"auto"``: a running one).
    Returns whether this call started or joined Ray (the caller shuts it down). The SIGTERM
    handler is kept (Ray's would exit before the run's outputs are written).

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
            ctx.gcs_address,
            address,
            time.perf_counter() - t0,
            len(nodes),
            ray.cluster_resources().get("CPU", 0),
        )
        return
    # Linux: a private directory (0700) above Ray's (which Ray makes 0777): its sockets, logs
    # and the token file are this user's only; the reaper removes it when the instance ends.
    # (Elsewhere Ray's own place: macOS's temporary directory is too long for its sockets.)
    root = reaper = None
    if sys.platform == "linux":
        root = tempfile.mkdtemp(prefix="agent_memory-ray-", dir=os.environ.get("RAY_TMPDIR"))
        reaper = Reaper(root)
    local_token_auth(root)
    cpus = num_cpus or os.cpu_count() or 1
    log.info(
        "Ray: starting a local instance (num_cpus=%d, object store %d MiB, no dashboard, on "
        "127.0.0.1, node timeout %s s; rollout.ray_address=null) ...",
        cpus,
        _OBJECT_STORE_MIB,
        node_timeout_s,
    )
    os.environ[MARKER] = root or ""  # inherited by every process Ray starts, not later ones
    try:
        with loopback_only():
            ray.init(
                # "local": always a new instance, never a cluster some earlier `ray start` left.
                address="local",
                num_cpus=cpus,
                include_dashboard=False,
                object_store_memory=_OBJECT_STORE_MIB * 2**20,
                log_to_driver=False,
                _system_config=health_check_config(node_timeout_s),
                _temp_dir=None if root is None else os.path.join(root, "ray"),
            )
    except BaseException:
        if reaper is not None:
            reaper.release()
        raise
    finally:
        del os.environ[MARKER]
    if reaper is not None:
        reaper.noted()
        _REAPERS.append(reaper)
    log.info(
        "Ray: started a local instance with %d CPUs in %.1f s (rollout.ray_address=null)",
        cpus,
        time.perf_counter() - t0,
    )


def stop_ray() -> None:
    """Shut Ray down in this process, then end what is left of the local instances it started
    (their reapers: no Ray process outlives the run) and remove their private directories."""
    import ray

    ray.shutdown()
    while _REAPERS:
        _REAPERS.pop().release()

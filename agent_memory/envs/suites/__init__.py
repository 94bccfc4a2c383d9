"""Benchmark suites people report on, as text envs: BabyAI (MiniGrid), TextArena,
TextWorld-Express and ScienceWorld.

Each module imports its suite's package only when an env is built, so the ids register without
it; each package is an extra of pyproject.toml (``minigrid``, ``textarena``, ``twx``,
``scienceworld``). TextWorld-Express and ScienceWorld run their games in a Java process: they
need a Java runtime (``java`` on the path; Debian: ``apt-get install default-jre-headless``).
Nothing is downloaded at run time: the games ship in the wheels.
"""

from __future__ import annotations

import shutil

__all__ = ["JAVA_SUITES", "missing_java", "require_java"]

#: The registered ids whose games run in a Java process -> the suite's name.
JAVA_SUITES = {
    "agent_memory/TextWorldExpress-v0": "TextWorld-Express",
    "agent_memory/ScienceWorld-v0": "ScienceWorld",
}


def missing_java(suite: str) -> str | None:
    """Why ``suite`` cannot start here (no ``java`` on the path, and the fix), or None.

    Example:
        >>> missing_java("ScienceWorld") if shutil.which("java") is None else None
    """
    if shutil.which("java") is not None:
        return None
    return (
        f"{suite} runs its games in a Java process, but no `java` is on the path: install a "
        "Java runtime (Debian/Ubuntu: apt-get install default-jre-headless), or choose another env"
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

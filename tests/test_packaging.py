"""What the installed wheel carries: the library alone, none of its test and benchmark scaffolding
(the mock server in ``scripts/mock_server``, ``tests/``), which the library never imports."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from setuptools import find_packages

REPO = Path(__file__).resolve().parents[1]
#: Top-level modules of the repository that are not the library.
SCAFFOLDING = ("mock_server", "bench_lib", "tests")


def _include() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["packages"]["find"]["include"]


def test_the_wheel_takes_the_library_alone(tmp_path):
    packages = find_packages(where=str(REPO), include=_include())
    assert "agent_memory" in packages
    assert "agent_memory.serving" in packages  # the vLLM launcher users run stays
    outside = [p for p in packages if p != "agent_memory" and not p.startswith("agent_memory.")]
    assert outside == []
    # A top-level package whose name merely starts with the library's is not taken either.
    for name in ("agent_memory", "agent_memory_testing"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    assert find_packages(where=str(tmp_path), include=_include()) == ["agent_memory"]


def test_the_library_imports_no_scaffolding():
    found = []
    for path in sorted((REPO / "agent_memory").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [
                f"{path.relative_to(REPO)}: {name}"
                for name in names
                if name.partition(".")[0] in SCAFFOLDING
            ]
    assert found == []

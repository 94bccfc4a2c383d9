"""The package's shape, held where review put it (issue 46): small modules, a formatter configured
once (no per-statement skips), and a typed policy boundary."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agent_memory"
#: The longest a module may be: past it, a module holds more than one concept (split it).
MAX_MODULE_LINES = 550


def _python_files(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_longer_than_the_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files(PACKAGE)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (expected none, split them): {long}"


def test_the_formatter_is_configured_once_not_skipped_per_statement():
    marker = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _python_files(PACKAGE, ROOT / "tests", ROOT / "scripts")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if marker.search(line) and p != Path(__file__).resolve()
    ]
    assert not found, (
        f"formatter skips (expected none; pyproject's [tool.ruff] is the one setting): {found}"
    )


def test_no_policy_parameter_is_typed_any():
    untyped = re.compile(r"\bpolicy: Any\b")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _python_files(PACKAGE)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if untyped.search(line)
    ]
    assert not found, f"'policy: Any' parameters (expected none: type them with the port): {found}"

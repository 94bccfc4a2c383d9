"""The docs' row-schema tables (docs/output-schema.md) are ROW_COLUMNS and EPISODE_COLUMNS, column for column."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from agent_memory.rollout.driver.writer import EPISODE_COLUMNS, ROW_COLUMNS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "output-schema.md"
_ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \| (.*) \|$")


def _type(kind: str) -> str:
    if kind.startswith("list:"):
        return f"list<{_type(kind[5:])}>"
    return {"bool_": "bool"}.get(kind, kind)


def _tables() -> list[dict[str, tuple[str, str]]]:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Token rows", 1)[1].split("\n## ", 1)[0]
    tables: list[dict[str, tuple[str, str]]] = []
    current: dict[str, tuple[str, str]] | None = None
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            if current is None:
                current = {}
                tables.append(current)
            current[m.group(1)] = (m.group(2), html.unescape(m.group(3).replace("\\|", "|")))
        elif not line.startswith("|"):
            current = None
    return tables


@pytest.mark.parametrize(("index", "columns"), [(0, ROW_COLUMNS), (1, EPISODE_COLUMNS)])
def test_readme_schema_table_matches_the_writer(index, columns):
    tables = _tables()
    assert len(tables) == 2
    want = {name: (_type(kind), meaning) for name, (kind, meaning) in columns.items()}
    assert tables[index] == want
    assert list(tables[index]) == list(columns)  # in the writer's order

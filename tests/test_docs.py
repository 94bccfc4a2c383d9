"""The docs site: the generated configuration page is current, every page is reachable, links resolve.

tests/test_readme.py runs the pages' code blocks; .ci/run builds the site with
``mkdocs build --strict`` (which also fails on a broken link inside docs/).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
_LINK = re.compile(r"\]\(([^)\s]+)\)")

sys.path.insert(0, str(REPO / "scripts"))
import gen_config_docs  # noqa: E402

sys.path.pop(0)


def test_configuration_page_is_what_the_configs_generate():
    page = DOCS / "configuration.md"
    assert page.read_text(encoding="utf-8") == gen_config_docs.render(), (
        "docs/configuration.md is out of date: run python scripts/gen_config_docs.py"
    )


def test_the_generator_check_mode_agrees():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _yaml_keys() -> set[str]:
    key = re.compile(r"^\s*([A-Za-z_][\w-]*):")
    names = set()
    for path in (REPO / "configs").rglob("*.yaml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if m := key.match(line):
                names.add(m.group(1))
    return names


def test_every_yaml_key_is_on_the_configuration_page():
    documented = {k.path.rsplit(".", 1)[-1] for k in _all_keys()}
    assert _yaml_keys() <= documented


def _all_keys():
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        rel = path.relative_to(REPO / "configs")
        yield from gen_config_docs.parse(
            path.read_text(encoding="utf-8"), gen_config_docs._prefix(rel)
        )


def test_a_group_key_is_documented_by_its_override_path_default_and_comment():
    def keys(name: str, prefix: str) -> dict:
        text = (REPO / "configs" / name).read_text(encoding="utf-8")
        return {k.path: k for k in gen_config_docs.parse(text, prefix)}

    top_k = keys("memory/retrieval.yaml", "memory")["memory.params.top_k"]
    assert (top_k.default, top_k.comment) == ("3", "Older steps retrieved at most.")
    assert keys("rollout/default.yaml", "rollout")["rollout.num_groups"].default == "4"
    env_id = keys("env/sokoban.yaml", "env")["env.id"]
    assert (
        env_id.comment == "Gymnasium id, registered by `import agent_memory.envs`."
    )  # not the file's header
    assert all(k.comment for k in _all_keys() if not k.path.endswith("[]"))


def test_every_docs_page_is_in_the_nav():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


@pytest.mark.parametrize("page", ["README.md"])
def test_readme_links_resolve(page):
    text = (REPO / page).read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(text):
        if "://" in target:
            continue
        path = target.split("#", 1)[0]
        if path and not (REPO / path).exists():
            broken.append(target)
    assert not broken, f"{page} links to missing files: {broken}"


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


_CHECKPOINT = re.compile(r"\biter_(\w+)")


def test_the_docs_name_checkpoint_directories_as_the_trainer_writes_them():
    """``checkpoints/iter_000002/`` (zero-padded: they sort in order), not ``iter_N``."""
    from agent_memory.train.checkpoint import checkpoint_name

    placeholder = "N" * len(checkpoint_name(0).removeprefix("iter_"))
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    wrong = [
        f"{page.relative_to(REPO)}: iter_{name}"
        for page in pages
        for name in _CHECKPOINT.findall(page.read_text(encoding="utf-8"))
        if name != placeholder
        and not (name.isdigit() and checkpoint_name(int(name)) == f"iter_{name}")
    ]
    assert not wrong, f"checkpoint directories are named like {checkpoint_name(2)}: {wrong}"
    assert "checkpoints/iter_000002/" in (DOCS / "training.md").read_text(encoding="utf-8")


def test_every_test_the_failure_guarantees_name_exists():
    """docs/failures.md lists each guarantee beside its test: a renamed or removed test would
    leave a guarantee that nothing checks. ``file.py::name`` and a following ``::name`` (same
    file) must each name a test function of the suite."""
    text = (REPO / "docs" / "failures.md").read_text()
    sources = {p.name: p.read_text() for p in (REPO / "tests").rglob("test_*.py")}
    named, missing, current = 0, [], None
    for m in re.finditer(r"`(?:tests/(?:\w+/)*)?(test_\w+\.py)?::(\w+)", text):
        current = m.group(1) or current
        named += 1
        if current is None or not re.search(rf"def {m.group(2)}\b", sources.get(current, "")):
            missing.append(f"{current}::{m.group(2)}")
    assert named >= 50 and missing == [], missing


def test_sphinx_roles_in_docstrings_become_autorefs_references():
    """Markdown shows a Sphinx role (``:class:`X```) as literal text: the docs site's griffe
    extension rewrites each into an optional autorefs reference, the name resolved in the
    docstring's scope (a link where the target is rendered, code where not)."""
    import griffe

    sys.path.insert(0, str(REPO))
    try:
        import mkdocs_hooks
    finally:
        sys.path.pop(0)

    assert mkdocs_hooks.rewrite_roles(
        "See :class:`~agent_memory.wrappers.HistoryOptions`, :meth:`Cls.run` and :mod:`x.y`.",
        lambda name: name if name.startswith("agent_memory.") else f"pkg.{name}",
    ) == (
        'See <autoref identifier="agent_memory.wrappers.HistoryOptions" optional>'
        '`HistoryOptions`</autoref>, <autoref identifier="pkg.Cls.run" optional>`Cls.run`'
        '</autoref> and <autoref identifier="pkg.x.y" optional>`x.y`</autoref>.'
    )
    pkg = griffe.load(
        "agent_memory",
        search_paths=[str(REPO)],
        extensions=griffe.load_extensions(mkdocs_hooks.SphinxRoles),
    )
    text_adapter = pkg["envs.text_adapter"].docstring.value
    assert ":class:`" not in text_adapter and ":mod:`" not in text_adapter
    assert (
        '<autoref identifier="agent_memory.envs.text_adapter.TextAdapter" optional>`TextAdapter`'
        in text_adapter
    )  # a bare name resolved in the module's scope
    assert not [
        (obj.path, role)
        for obj in _walk(pkg)
        if obj.docstring and (role := re.search(r":[a-z]+:`", obj.docstring.value))
    ]


def _walk(obj):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)

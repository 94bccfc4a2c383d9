"""Every code block of README.md and docs/**/*.md runs as written, or says why not.

Conventions (HTML comments on the lines right above a block's opening fence; a reader never sees
them):

* A ```python block runs on its own: a fresh interpreter in an empty temporary directory, as a
  reader who copies that one block would run it (no block relies on names from another).
* A ```bash block runs with ``bash -euo pipefail`` in a temporary directory in which ``scripts/``
  and ``configs/`` link to the repository's, so commands such as ``python scripts/rollout.py``
  run as written and their outputs (``outputs/``, ``multirun/``) land in that directory.
  ``<!-- writes: GLOB ... -->`` lists files the block must have written there (what the page
  promises).
* A reader may run a block in a checkout of this repository (``python scripts/rollout.py`` is run
  from its root): what a block leaves behind must be in a directory the checkout's ``.gitignore``
  ignores (``outputs/``, ``multirun/``), or be the reader's own files that the block writes on
  purpose (e.g. their env's module), named by ``<!-- yours: NAME ... -->`` (top-level names).
  Nothing else may be left, in the block's directory or in the repository's root.
* ``<!-- after: the block above -->`` runs a ```bash block after the page's previous ```bash block,
  in the same directory (that block's code runs first): for a page that builds on a file the block
  above wrote.
* ``<!-- not run: REASON -->`` leaves a block (any language) out: it is no test (not a skipped
  one), and :func:`test_every_block_is_runnable_or_says_why_not` checks that it says why, so
  leaving out is explicit, never silent. Blocks of any other language must say so.

The blocks import this checkout (``PYTHONPATH``), and TextWorld games go to a temporary cache.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# The README first, then every docs page (tests/test_docs.py checks the site itself).
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
RUNNABLE = ("python", "bash")
_COMMENT = re.compile(r"^<!--\s*(.*?)\s*-->$")
_FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    """One fenced block: its language, code, first line number and the markers above it."""

    lang: str
    code: str
    line: int
    markers: list[str] = field(default_factory=list)
    page: str = "README.md"

    @property
    def where(self) -> str:
        """``page:line``, as the failure messages name a block."""
        return f"{self.page}:{self.line}"

    def marker(self, name: str) -> str | None:
        """The text after ``name`` in a marker (``not run: why`` -> ``why``), or None."""
        for m in self.markers:
            if m == name or m.startswith(f"{name}:"):
                return m[len(name) :].lstrip(":").strip()
        return None


def parse_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The fenced blocks of a markdown text, with the HTML comment lines right above each.

    Example:
        >>> [(b.lang, b.code, b.markers) for b in parse_blocks(
        ...     "<!-- not run: slow -->\\n```bash\\nsleep 9\\n```\\n\\n```python\\nx = 1\\n```\\n")]
        [('bash', 'sleep 9\\n', ['not run: slow']), ('python', 'x = 1\\n', [])]
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        markers = []
        j = i - 1
        while j >= 0 and (m := _COMMENT.match(lines[j].strip())):
            markers.insert(0, m.group(1))
            j -= 1
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: the block is never closed")
        code = "".join(f"{line}\n" for line in lines[i + 1 : end])
        blocks.append(Block(opening.group(1), code, i + 1, markers, page))
        i = end + 1
    return blocks


def _chain(blocks: list[Block]) -> list[Block]:
    """``blocks`` with each ``after:`` bash block's code preceded by the code of the page's
    previous bash block (itself chained), so that it runs where that block left its files."""
    previous: Block | None = None
    for block in blocks:
        if block.lang != "bash":
            continue
        if block.marker("after") is not None:
            assert previous is not None, f"{block.where}: 'after:' with no ```bash block above"
            block.code = previous.code + block.code
        previous = block
    return blocks


BLOCKS = [
    block
    for page in PAGES
    for block in _chain(
        parse_blocks(page.read_text(encoding="utf-8"), page.relative_to(REPO).as_posix())
    )
]


def _env(tmp_path: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        # `python` in a bash block is the interpreter running the tests (the project's venv).
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
        "PYTHONPATH": path,
        "AGENT_MEMORY_CACHE": str(tmp_path / "cache"),
        "MPLBACKEND": "Agg",
    }


#: The optional extras' top-level modules (as conftest.py's EXTRA_ROOTS for the doctests).
EXTRAS = ("torch", "transformers", "trl", "sentence_transformers", "tensorboard")
_WANTS = re.compile(r"No module named '(\w+)|pip install (?:-e \"\.|\"agent-memory)\[")


def wants_an_extra(stderr: str, absent: list[str] | None = None) -> str | None:
    """Why a block that failed with ``stderr`` wants an optional extra that is not installed
    (its last line), or None: it imported one of the ``absent`` :data:`EXTRAS`, or the package
    refused with its own line naming the extra to install while one is absent.

    Example:
        >>> wants_an_extra("Traceback ...\\nModuleNotFoundError: No module named 'torch'", ["torch"])
        "ModuleNotFoundError: No module named 'torch'"
        >>> wants_an_extra("ModuleNotFoundError: No module named 'numpy'", ["torch"])
        >>> wants_an_extra('Config error: needs torch: pip install -e ".[train]"', [])
    """
    if absent is None:
        absent = [m for m in EXTRAS if importlib.util.find_spec(m) is None]
    last = (stderr.strip().splitlines() or [""])[-1]
    found = _WANTS.search(last)
    if not absent or found is None or (found.group(1) and found.group(1) not in absent):
        return None
    return last


def _run(args: list[str], cwd: Path, block: Block, timeout: int = 300) -> None:
    proc = subprocess.run(
        args, cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0 and (why := wants_an_extra(proc.stderr)):
        pytest.skip(f"{block.where}: {why}")
    assert proc.returncode == 0, (
        f"{block.where} ({block.lang}) failed with exit code {proc.returncode}:\n"
        f"{block.code}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )


def test_every_block_is_runnable_or_says_why_not() -> None:
    assert sum(b.lang == "python" for b in BLOCKS) >= 3  # the parser found the blocks
    assert {b.page for b in BLOCKS} > {"README.md"}  # and the docs pages' blocks
    assert sum(b.lang in RUNNABLE for _, b in RUN) >= 10  # and most of them run
    for block in BLOCKS:
        reason = block.marker("not run")
        where = block.where
        if reason is not None:
            assert reason, f"{where}: write why it is not run: <!-- not run: REASON -->"
        else:
            assert block.lang in RUNNABLE, (
                f"{where}: a ```{block.lang} block cannot be run: mark it <!-- not run: REASON -->"
            )


def _ignore_patterns() -> list[str]:
    """The repository's ``.gitignore`` patterns (it has no negations nor nested paths)."""
    lines = (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if p.startswith("!") or "/" in p.strip("/")], patterns
    return patterns


def untracked(root: Path, names: set[str]) -> list[str]:
    """The entries of ``names`` (top-level names in ``root``) that a checkout's ``.gitignore``
    does not ignore: what ``git status`` would list as untracked, were ``root`` the checkout.
    A directory whose own ``.gitignore`` ignores everything in it (``*``: mypy's, ruff's and
    pytest's caches write one, e.g. ``mypy`` run while the suite runs) is ignored too.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> for name in ("outputs", "out", "__pycache__", ".a_cache"):
        ...     (root / name).mkdir()
        >>> (root / "notes.txt").touch()
        >>> _ = (root / ".a_cache" / ".gitignore").write_text("# made by a tool\\n*\\n")
        >>> untracked(root, {"outputs", "out", "__pycache__", "notes.txt", ".a_cache"})
        ['notes.txt', 'out']
    """
    patterns = _ignore_patterns()

    def ignored(name: str) -> bool:
        is_dir = (root / name).is_dir()
        own = root / name / ".gitignore"
        if is_dir and own.is_file() and "*" in own.read_text(encoding="utf-8").split():
            return True
        return any(
            fnmatch.fnmatch(name, p.strip("/")) and (is_dir or not p.endswith("/"))
            for p in patterns
        )

    return sorted(n for n in names if not ignored(n))


def _once(blocks: list[Block]) -> dict[str, Block]:
    """``blocks`` by test id; a block that repeats an earlier one word for word (language, code
    and markers: e.g. the README's training command, again on docs/training.md) is not run
    twice: the earlier one's id names both places.

    Example:
        >>> a, b = Block("bash", "ls\\n", 3), Block("bash", "ls\\n", 9, page="docs/x.md")
        >>> list(_once([a, b, Block("python", "x = 1\\n", 12)]))
        ['README.md:L3+docs/x.md:L9-bash', 'README.md:L12-python']
    """
    places: dict[tuple[str, str, tuple[str, ...]], list[Block]] = {}
    for b in blocks:
        places.setdefault((b.lang, b.code, tuple(b.markers)), []).append(b)
    return {
        "+".join(f"{b.page}:L{b.line}" for b in same) + f"-{same[0].lang or 'text'}": same[0]
        for same in places.values()
    }


#: The blocks that run (a ``not run:`` block would only ever be a skipped test), once each.
RUN = list(_once([b for b in BLOCKS if b.marker("not run") is None]).items())


@pytest.mark.parametrize(
    "block",
    # A block that trains (scripts/train.py) takes 20 s or more: `pytest -m "not slow"` skips it.
    [
        pytest.param(b, marks=pytest.mark.slow) if "scripts/train.py" in b.code else b
        for _, b in RUN
    ],
    ids=[name for name, _ in RUN],
)
def test_readme_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    if block.lang not in RUNNABLE:
        pytest.fail(f"{block.where}: ```{block.lang} without <!-- not run: REASON -->")
    repo_before = set(os.listdir(REPO))
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.code, encoding="utf-8")
        ours = {"block.py"}
        _run([sys.executable, str(script)], tmp_path, block)
    else:
        for name in ("scripts", "configs"):
            (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
        ours = {"scripts", "configs"}
        _run(["bash", "-euo", "pipefail", "-c", block.code], tmp_path, block)
    for pattern in (block.marker("writes") or "").split():
        assert list(tmp_path.glob(pattern)), (
            f"{block.where} promises {pattern}; found none under {tmp_path}"
        )
    yours = {name.strip("/") for name in (block.marker("yours") or "").split()}
    left = set(os.listdir(tmp_path)) - ours - {"cache"}  # cache: _env's AGENT_MEMORY_CACHE
    assert yours <= left, f"{block.where}: <!-- yours: --> names {sorted(yours - left)}, not left"
    stray = untracked(tmp_path, left - yours)
    assert not stray, (
        f"{block.where} leaves {stray}, which a checkout does not ignore: a reader who runs the "
        "block in the repository's root gets them as untracked files. Write outputs under "
        "outputs/ (or name the reader's own files in <!-- yours: NAME ... -->)"
    )
    in_repo = untracked(REPO, set(os.listdir(REPO)) - repo_before)
    assert not in_repo, f"{block.where} wrote {in_repo} into the repository's root"

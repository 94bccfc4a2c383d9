"""The docs site as a reader's browser shows it: pages built by ``mkdocs build --strict`` (as
``.ci/run`` builds them) and rendered in headless Chromium have every code block of their
Markdown source, every image loaded, and every mermaid diagram drawn as an SVG; and (from the
built HTML alone, no browser) the API reference shows no docstring's Sphinx role as text.

The test runs offline: ``.ci/run`` installs what it needs beforehand, Debian's Chromium (driven by
Playwright for Python, from the ``dev`` extra, with ``executable_path``: no browser download) and
the ``mermaid.min.js`` the site loads from a CDN (from the npm registry, into
``.cache/mermaid/``); the test serves that file for the CDN's address and refuses every other
request that leaves the machine. Outside CI the test skips when they are missing; in CI (``CI``
set) it fails.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_readme import parse_blocks

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: Where .ci/run puts mermaid's browser bundle (``AGENT_MEMORY_MERMAID_JS`` overrides it).
MERMAID_JS = Path(
    os.environ.get("AGENT_MEMORY_MERMAID_JS", REPO / ".cache" / "mermaid" / "mermaid.min.js")
)
#: mkdocs-material loads mermaid from ``https://unpkg.com/mermaid@11/dist/mermaid.min.js``.
MERMAID_URL = re.compile(r"^https://[^/]+/mermaid(@[^/]+)?/dist/mermaid\.min\.js$")
INSTALL = (
    "apt-get install -y chromium; pip install playwright (the dev extra); and mkdir -p "
    ".cache/mermaid && cd .cache/mermaid && npm pack mermaid@11 && tar -xzf mermaid-*.tgz "
    "--strip-components=2 package/dist/mermaid.min.js (as .ci/run does)"
)
#: Chromium's flags for a machine without network: no background connections, no sandbox (root).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: A closed shadow root (where mkdocs-material puts a diagram's SVG) opened for the test to see.
OPEN_SHADOW_ROOTS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
  return attach.call(this, Object.assign({}, init, {mode: "open"}));
};
"""
PAGES = ["concepts.md", "training.md", "your-own-env.md"]


def chromium() -> str | None:
    """Debian's Chromium (or ``AGENT_MEMORY_CHROMIUM``), if installed."""
    if path := os.environ.get("AGENT_MEMORY_CHROMIUM"):
        return path if Path(path).is_file() else None
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def missing() -> list[str]:
    """What this test needs that is not installed."""
    out = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        out.append("the playwright package")
    if chromium() is None:
        out.append("Chromium (/usr/bin/chromium)")
    if not MERMAID_JS.is_file():
        out.append(f"mermaid's bundle ({MERMAID_JS})")
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if lacking := missing():
        message = f"the docs-site test needs {', '.join(lacking)}: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _route(base_url: str):
    """Pages and assets from the local server; mermaid from the installed bundle; nothing
    from anywhere else (the test runs offline: e.g. the theme's web fonts fall back)."""

    def handle(route) -> None:
        url = route.request.url
        if url.startswith(base_url):
            route.continue_()
        elif MERMAID_URL.match(url):
            route.fulfill(path=str(MERMAID_JS), content_type="text/javascript")
        else:
            route.abort()

    return handle


def test_the_api_reference_shows_no_sphinx_roles_as_text(site):
    """The docstrings' ``:class:`~pkg.X``` roles render as links (or code), not literal text;
    needs only the built site (no browser)."""
    role = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):(?:`|<code>)")
    shown = {
        str(page.relative_to(site)): role.findall(text)
        for page in sorted((site / "api").rglob("*.html"))
        if role.search(text := page.read_text(encoding="utf-8")) or "<autoref" in text
    }
    assert not shown, f"Sphinx roles shown as text (or unresolved <autoref>): {shown}"
    wrappers = (site / "api" / "wrappers" / "index.html").read_text(encoding="utf-8")
    assert 'href="#agent_memory.wrappers.HistoryOptions"><code>HistoryOptions</code></a>' in (
        wrappers
    )  # :class:`~agent_memory.wrappers.HistoryOptions`: a link showing only the last name


@pytest.mark.parametrize("name", PAGES)
def test_a_rendered_page_shows_its_code_blocks_images_and_diagrams(browser, base_url, name):
    source = (DOCS / name).read_text(encoding="utf-8")
    blocks = parse_blocks(source, name)
    code = [b for b in blocks if b.lang != "mermaid"]
    diagrams = [b for b in blocks if b.lang == "mermaid"]
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", source)
    assert code or diagrams or images, f"{name} has nothing this test checks"
    page = browser.new_page()
    try:
        _check_page(page, base_url, name, code, diagrams, images)
    finally:
        page.close()


def _check_page(page, base_url, name, code, diagrams, images) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.add_init_script(OPEN_SHADOW_ROOTS)
    page.route("**/*", _route(base_url))
    page.goto(f"{base_url}/{name.removesuffix('.md')}/", wait_until="load")
    article = page.locator("article")

    # Every mermaid diagram is drawn: an SVG of its kind (a diagram mermaid cannot parse is
    # drawn as an "error" SVG instead, or not at all). First: until then its source is a
    # <pre><code> of the page.
    if diagrams:
        svgs = article.locator("div.mermaid svg")
        try:  # the theme swaps each diagram's <pre> for a <div> holding the SVG when drawn
            page.wait_for_function(
                "n => document.querySelectorAll('article div.mermaid').length === n && "
                "[...document.querySelectorAll('article div.mermaid')].every("
                "d => d.shadowRoot && d.shadowRoot.querySelector('svg'))",
                arg=len(diagrams),
                timeout=30_000,
            )
        except PlaywrightTimeout:
            pytest.fail(f"{name}: mermaid drew no SVG within 30 s (script errors: {errors})")
        assert svgs.count() == len(diagrams)
        for i, block in enumerate(diagrams):
            svg = svgs.nth(i)
            role = svg.get_attribute("aria-roledescription")
            assert role and role != "error", f"{block.where}: mermaid drew {role!r}"
            box = svg.bounding_box()
            assert box and box["width"] > 0 and box["height"] > 0, f"{block.where}: empty"
            labels = re.findall(r"participant \w+ as ([^\n]+)", block.code)
            drawn = svg.text_content() or ""
            assert all(label.strip() in drawn for label in labels), (block.where, drawn)

    # Every fenced block of the source is a code block of the page, with the source's text.
    shown = article.locator("pre > code")
    assert shown.count() == len(code), f"{name}: {shown.count()} code blocks, {len(code)} fenced"
    for i, block in enumerate(code):
        text = shown.nth(i).inner_text()
        assert text.strip() == block.code.strip(), f"{block.where}: rendered as\n{text}"

    # Every image is there and loaded (a broken one has naturalWidth 0).
    imgs = article.locator("img")
    assert imgs.count() == len(images), f"{name}: {imgs.count()} <img>, {len(images)} in source"
    for i in range(imgs.count()):
        img = imgs.nth(i)
        img.scroll_into_view_if_needed()
        page.wait_for_function("img => img.complete", arg=img.element_handle(), timeout=30_000)
        width = img.evaluate("img => img.naturalWidth")
        assert width > 0, f"{name}: {img.get_attribute('src')} did not load"

    assert errors == [], f"{name}: script errors {errors}"

"""Build-time helpers of the docs site (mkdocs.yml names this file).

* ``ExampleSections``, a griffe extension: the docstrings write doctests under ``Example:``, which
  Google style reads as an admonition of Markdown text (``>>>`` lines would render as quotes);
  this reads it as an ``Examples:`` section, so the doctests render as code.
* ``on_pre_build``, a mkdocs hook: refuses to build while docs/configuration.md is not what
  ``scripts/gen_config_docs.py`` writes from configs/ (run that script to update the page).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
REPO = Path(__file__).resolve().parent


class ExampleSections(griffe.Extension):
    """Reads a docstring's ``Example:`` section as ``Examples:`` (doctests as code)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)


def on_pre_build(config: object, **kwargs: object) -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        from mkdocs.exceptions import PluginError

        raise PluginError(check.stdout.strip() or check.stderr.strip())

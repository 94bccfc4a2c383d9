"""Build-time helpers of the docs site (mkdocs.yml names this file).

* ``ExampleSections``, a griffe extension: the docstrings write doctests under ``Example:``, which
  Google style reads as an admonition of Markdown text (``>>>`` lines would render as quotes);
  this reads it as an ``Examples:`` section, so the doctests render as code.
* ``SphinxRoles``, a griffe extension: the docstrings cross-reference with Sphinx roles
  (``:class:`~agent_memory.x.Y```), which Markdown would show as literal text; this rewrites each
  role into an optional mkdocs-autorefs reference: a link where the target is on the API
  reference, code where it is not (no warning, so ``--strict`` holds).
* ``on_pre_build``, a mkdocs hook: refuses to build while docs/configuration.md is not what
  ``scripts/gen_config_docs.py`` writes from configs/ (run that script to update the page).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
#: A Sphinx cross-reference role: ``:class:`name```, ``:meth:`~pkg.mod.Cls.name```, ...
_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj|const):`(~?)([\w.]+)`")
REPO = Path(__file__).resolve().parent


class ExampleSections(griffe.Extension):
    """Reads a docstring's ``Example:`` section as ``Examples:`` (doctests as code)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)


def rewrite_roles(text: str, resolve: Callable[[str], str]) -> str:
    """Rewrites the Sphinx roles in ``text`` into optional autorefs references.

    ``resolve`` maps a name as written to the identifier it stands for (a dotted path); ``~``
    shows only the last name, as in Sphinx. "Optional" is autorefs' word for: a link where the
    identifier is rendered somewhere on the site, the title as code (no warning) where not.

    Example:
        >>> rewrite_roles(":class:`~a.b.C`", str)
        '<autoref identifier="a.b.C" optional>`C`</autoref>'
        >>> rewrite_roles(":meth:`C.run`", lambda name: "a.b." + name)
        '<autoref identifier="a.b.C.run" optional>`C.run`</autoref>'
    """

    def one(match: re.Match[str]) -> str:
        tilde, name = match.groups()
        title = name.rsplit(".", 1)[-1] if tilde else name
        return f'<autoref identifier="{resolve(name)}" optional>`{title}`</autoref>'

    return _ROLE.sub(one, text)


def _resolver(obj: griffe.Object) -> Callable[[str], str]:
    """Resolves a role's name as Sphinx does: a dotted path from the package as is, else its
    first part in ``obj``'s scope (members, then enclosing class and module, then imports)."""

    def resolve(name: str) -> str:
        if name.startswith(f"{obj.package.name}."):
            return name
        first, dot, rest = name.partition(".")
        try:
            return obj.resolve(first) + dot + rest
        except griffe.NameResolutionError:
            return name  # e.g. a builtin: shown as code

    return resolve


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring of a loaded package (see ``rewrite_roles``)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
        objects: list[griffe.Object] = [pkg]
        while objects:
            obj = objects.pop()
            if obj.docstring is not None:
                obj.docstring.value = rewrite_roles(obj.docstring.value, _resolver(obj))
            objects.extend(m for m in obj.members.values() if isinstance(m, griffe.Object))


def on_pre_build(config: object, **kwargs: object) -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        from mkdocs.exceptions import PluginError

        raise PluginError(check.stdout.strip() or check.stderr.strip())

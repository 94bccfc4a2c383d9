"""The docstrings' examples (``--doctest-modules``) without the 'llm' extra: skipped, not failed.

An ``Example:`` that builds a model needs torch or transformers, which the base install lacks;
the tests skip with ``pytest.importorskip``, which a reader's example should not carry. So a doctest
that stops because one of :data:`EXTRA_ROOTS` is not installed here (``ModuleNotFoundError``, or
the package's own error saying which extra to install) is reported as skipped, with the reason.
Any other failure (and that one, where the extras are installed) stays a failure.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from collections.abc import Iterator
from typing import Any

import pytest
from _pytest.doctest import DoctestItem

#: Top-level modules of the optional extras that docstring examples may use.
EXTRA_ROOTS = ("torch", "transformers", "trl", "sentence_transformers", "tensorboard")
#: The package's own errors for a missing extra end with how to install it.
_INSTALL = re.compile(r'pip install (-e "\.|"agent-memory)\[')


def missing_extra(error: BaseException | None) -> str | None:
    """Why a doctest that failed with ``error`` wants an extra that is not installed, or None.

    Either the example imported one of :data:`EXTRA_ROOTS` (``ModuleNotFoundError``), or the
    package answered with its own error naming the extra to install (``pip install ...``) while
    one of them is absent.

    Example:
        >>> missing_extra(ModuleNotFoundError("No module named 'no_such'", name="no_such"))
        >>> missing_extra(ValueError("torch"))
    """
    if isinstance(error, doctest.UnexpectedException):
        error = error.exc_info[1]
    if isinstance(error, ModuleNotFoundError) and error.name:
        root = error.name.partition(".")[0]
        if root in EXTRA_ROOTS and importlib.util.find_spec(root) is None:
            return f"{root} is not installed (an optional extra)"
    if isinstance(error, doctest.DocTestFailure) and _INSTALL.search(error.got):
        absent = [m for m in EXTRA_ROOTS if importlib.util.find_spec(m) is None]
        if absent:
            return error.got.strip().splitlines()[-1]
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A doctest that fails only for want of an optional extra's module is skipped."""
    report = yield
    if isinstance(item, DoctestItem) and call.when == "call" and call.excinfo is not None:
        why = missing_extra(call.excinfo.value)
        if why is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.reportinfo()[1] or 0, f"Skipped: {why}")
    return report


#: Modules of the package whose classes derive from an optional extra's (relative path -> the
#: extra's top-level module): without it they are not collected for their doctests.
NEEDS_EXTRA = {"agent_memory/openenv_server.py": "openenv"}


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """Leave out a module of :data:`NEEDS_EXTRA` whose extra is not installed here."""
    rel = collection_path.as_posix().removeprefix(str(config.rootpath.as_posix()) + "/")
    root = NEEDS_EXTRA.get(rel)
    if root is not None and importlib.util.find_spec(root) is None:
        return True
    return None

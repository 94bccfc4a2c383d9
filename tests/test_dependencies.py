"""The installed transformers is one pyproject.toml allows, the range stops before the release
that removes what we call, and our own forward passes use no name transformers has deprecated
(issue "A newcomer runs their own env in five minutes", bug 7: transformers 5.24 renames
``past_key_values`` to ``cache``, the old name removed in 5.40)."""

from __future__ import annotations

import logging
import tomllib
import warnings
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def _requirements(name: str) -> Iterator[Requirement]:
    """Every requirement on ``name`` in pyproject.toml (dependencies and every extra)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines.extend(extra)
    for line in lines:
        req = Requirement(line)
        if req.name.lower() == name:
            yield req


def test_installed_transformers_is_in_the_declared_range():
    pytest.importorskip("transformers")
    reqs = list(_requirements("transformers"))
    assert reqs, "pyproject.toml declares no transformers requirement"
    installed = version("transformers")
    for req in reqs:
        assert req.specifier.contains(installed, prereleases=True), (
            f"transformers {installed} is installed but pyproject.toml says {req}"
        )


def test_the_declared_range_excludes_the_release_without_past_key_values():
    """5.40 removes the ``past_key_values`` name that transformers < 5.24 still needs."""
    for req in _requirements("transformers"):
        assert not req.specifier.contains(Version("5.40.0"), prereleases=True), str(req)
        assert not req.specifier.contains(Version("5.40.0rc1"), prereleases=True), str(req)


def _deprecations(run: Callable[[], object]) -> list[str]:
    """The deprecation warnings ``run()`` raises, and what transformers logs about deprecated
    names (its ``warning_once`` is forgotten first, so an earlier test cannot hide one)."""
    from transformers.utils import logging as hf_logging

    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())

    hf_logging.warning_once.cache_clear()
    logger = hf_logging.get_logger()  # the library's root logger: every module's ends here
    handler = Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        logger.removeHandler(handler)
    found = [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    return found + [m for m in logged if "deprecat" in m.lower()]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny_lm(request, tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agent_memory.models import build_tiny_lm

    words = ["go", "up", "down", "left", "right", "the", "box"]
    return build_tiny_lm(tmp_path_factory.mktemp(request.param), words, arch=request.param)


def test_scoring_forward_passes_use_no_deprecated_name(tiny_lm):
    import torch
    from transformers import AutoModelForCausalLM

    from agent_memory.policies.scoring import score_candidates

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm), local_files_only=True).eval()

    def run():
        with torch.no_grad():
            # Candidates of more than one token: the later ones run on the prompts' cache.
            return score_candidates(
                model, [[4, 5, 6], [7]], [[[4, 5], [6]], [[8, 9, 10], [5, 4]]], pad_id=0
            )

    assert _deprecations(run) == []
    assert torch.isfinite(run().scores).all()  # and the scores still come out


def test_model_backend_decoding_uses_no_deprecated_name(tiny_lm):
    from mock_server import ModelBackend
    from mock_server.backends import GenerationRequest, RequestSampling

    backend = ModelBackend(tiny_lm)
    ids = tuple(backend.encode("go up"))
    request = GenerationRequest(
        ids, "go up", RequestSampling(max_tokens=4, seed=3, ignore_eos=True)
    )
    answers: list = []
    assert _deprecations(lambda: answers.append(backend.generate(request))) == []
    assert len(answers[0].token_ids) == 4  # every step after the first reads the cache


def test_the_cache_name_follows_the_model_or_else_the_installed_library():
    """transformers >= 4.44 before the rename: ``past_key_values``; a wrapper whose forward
    hides the name (``**kwargs``) gets the installed library's name."""
    pytest.importorskip("transformers")
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from agent_memory.policies.local_model import cache_keyword, returned_cache

    class Old:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...

    class New:
        def forward(self, input_ids=None, cache=None, use_cache=None): ...

    class Wrapped:
        def forward(self, *args, **kwargs): ...

    renamed = "cache" in CausalLMOutputWithPast.__dataclass_fields__  # True on 5.24
    assert cache_keyword(Old()) == "past_key_values"
    assert cache_keyword(New()) == "cache"
    assert cache_keyword(Wrapped()) == ("cache" if renamed else "past_key_values")
    kv = object()
    out = CausalLMOutputWithPast(**{cache_keyword(Wrapped()): kv})
    assert _deprecations(lambda: returned_cache(out)) == []
    assert returned_cache(out) is kv

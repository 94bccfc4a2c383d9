"""The openai policy tests' server: test_openai.py's fake OpenAI-compatible server, one per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.policies.test_openai import FakeOpenAI, serve


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with serve() as state:
        yield state

"""Search-QA: Search-R1 style ``<search>`` / ``<answer>`` episodes over a generated corpus.

Modules: :mod:`.corpus` (fictitious entities, passages, 1-/2-hop questions), :mod:`.retrieval`
(``bm25s`` index, Search-R1's passage format), :mod:`.parsing` (action tags, exact match) and
:mod:`.env` (the Gymnasium env, id ``agent_memory/SearchQA-v0``).

Example:
    >>> import gymnasium as gym
    >>> env = gym.make("agent_memory.envs:agent_memory/SearchQA-v0")
    >>> obs, info = env.reset(seed=1)
    >>> obs.splitlines()[-1] == "Question: " + info["task"]
    True
"""

from __future__ import annotations

from agent_memory.envs.search_qa.corpus import (
    Corpus,
    Document,
    Hop,
    Question,
    generate_corpus,
    get_corpus,
)
from agent_memory.envs.search_qa.env import SearchQAEnv
from agent_memory.envs.search_qa.parsing import exact_match, normalize_answer, parse_action
from agent_memory.envs.search_qa.retrieval import (
    BM25Index,
    format_information,
    format_passages,
    get_index,
)

__all__ = [
    "BM25Index",
    "Corpus",
    "Document",
    "Hop",
    "Question",
    "SearchQAEnv",
    "exact_match",
    "format_information",
    "format_passages",
    "generate_corpus",
    "get_corpus",
    "get_index",
    "normalize_answer",
    "parse_action",
]

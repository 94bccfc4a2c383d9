"""``RetrievalMemory``: the recent window plus the most relevant older steps of the same episode.

RAG within an episode: per env, the last ``history_length`` steps verbatim and, before them in
a marked block, up to ``top_k`` older steps most similar to a query (the current observation, or
the newest step): scores above ``similarity_threshold``, reranked, deduplicated, shown in step
order. Steps are encoded once, at store time; a budget drops the lowest-ranked steps first.

Example:
    >>> mem = RetrievalMemory(num_envs=1, top_k=1, similarity_threshold=0.1)
    >>> for obs in ["Remember this: the key is BLUE.", "Owls form parliaments.",
    ...             "Sharks predate trees.", "Snails sleep for years."]:
    ...     mem.store({"observation": [obs], "action": ["next"]})
    >>> ctx, n = mem.fetch(2, queries=["Question: which colour was the key?"])
    >>> print(ctx[0])
    Relevant earlier steps:
    [Observation 1: 'Remember this: the key is BLUE.', Action 1: 'next']
    Recent steps:
    [Observation 3: 'Sharks predate trees.', Action 3: 'next']
    [Observation 4: 'Snails sleep for years.', Action 4: 'next']
    >>> n, mem.last_retrieved
    ([2], [[1]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import UNSET, Budget, EnvIds, Fetched
from agent_memory.memory.block_window import Block, BlockLayout, WindowedMemory
from agent_memory.memory.retrieval.ranking import Entry, StepRanking, window_bounds
from agent_memory.memory.retrieval.settings import RetrievalSettings
from agent_memory.memory.settings import SettingsAttributes
from agent_memory.tokens import TokenCounterSpec

__all__ = ["RetrievalMemory"]

#: Upper bound (estimate counter) of the "Step k:" label a chat block puts before a step.
_CHAT_LABEL = "Step 1000000:\n"


class RetrievalMemory(SettingsAttributes[RetrievalSettings], StepRanking, WindowedMemory):
    """Recent window + top-k relevant older steps of the same episode (see the module docstring).

    Args:
        num_envs, formatter, max_history_tokens, token_counter, capacity: as for HistoryMemory.
        **settings: the fields of :class:`RetrievalSettings`, each documented there.

    Raises:
        ValueError: a bad setting.
    """

    settings_class = RetrievalSettings

    #: ``fetch`` takes ``queries=[...]`` (one text per env).
    accepts_queries: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**self._shared(locals()))
        self.settings = RetrievalSettings(**settings)
        self.layout = BlockLayout(
            header=self.settings.header,
            window_header=self.settings.window_header,
            priority="window",
        )
        self._init_indexes(self.settings.encoder, self.settings.index)
        #: Per env of the last :meth:`fetch` (in its ``env_ids`` order): absolute step numbers
        #: of the retrieved steps, chronological.
        self.last_retrieved: list[list[int]] = []

    def _reset_env(self, i: int) -> None:
        self._clear(i)

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step per env in ``env_ids`` and encode its text (one batch for all envs).

        Raises:
            ValueError / TypeError: as :meth:`HistoryMemory.store`, or a record without one of
                ``embed_keys``. Nothing is stored when it raises.
        """
        keys = self.settings.embed_keys
        missing = [k for k in keys if isinstance(record, Mapping) and k not in record]
        if missing:
            raise ValueError(
                f"record has no key(s) {missing} to embed (embed_keys={list(keys)}); "
                f"got keys {sorted(record)}"
            )
        ids = self._ids(env_ids)
        self._window.store(record, ids)  # validates everything first
        if not ids:
            return
        cols = [record[k] for k in keys]
        texts = [
            "\n".join(str(c[j]) for c in cols) if len(cols) > 1 else str(cols[0][j])
            for j in range(len(ids))
        ]
        counts = self._window.step_counts
        self._append(ids, texts, [counts[i] - 1 for i in ids])

    def fetch(
        self,
        history_length: int,
        env_ids: EnvIds = None,
        *,
        max_history_tokens: Budget = UNSET,
        queries: Sequence[str | None] | None = None,
    ) -> Fetched:
        """Each env's context: retrieved older steps (marked block), then the recent window.

        Args:
            history_length: the recent window: -1 whole episode (nothing to retrieve), 0 none
                (every step is a candidate), k > 0 the last k steps.
            env_ids: which envs (all when None), in the order of the returned lists.
            max_history_tokens: token budget of the whole context (as for
                :meth:`HistoryMemory.fetch`).
            queries: one query per env in ``env_ids`` (None entries: as ``query_source`` says).

        Returns:
            ``Fetched(contexts, lengths)``; ``lengths`` count the window's steps.
            :attr:`last_retrieved` lists each env's retrieved step numbers.

        Raises:
            ValueError: bad arguments, or ``query_source="explicit"`` without ``queries``.
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        self._check_queries(queries, len(ids))
        ranked = self._retrieve(hl, ids, queries)
        chat = self.formatter.output == "messages"
        label = self.token_counter(_CHAT_LABEL) if chat else 0
        blocks = [self._block(i, ranked.get(j, []), label) for j, i in enumerate(ids)]
        # The per-step counts include one separator each, which covers the "\n" after the
        # block unless the formatter joins with "".
        overhead = self.layout.overhead(
            self.token_counter, chat, uncovered="" if self.formatter.separator else "\n"
        )
        fetched, kept = self.layout.fetch(self._window, hl, ids, budgets, blocks, overhead)
        first = self._window.first_steps
        self.last_retrieved = [
            sorted(first[i] + p for p in block.items[:k]) if block is not None else []
            for i, block, k in zip(ids, blocks, kept, strict=True)
        ]
        return fetched

    def config(self) -> dict[str, Any]:
        """The retrieval settings (JSON-able), as in :meth:`state_dict`."""
        config = self.settings.to_dict()
        built = {"encoder": self.encoder.spec(), "index": self.index_name}
        return {**config, **built, "embed_keys": list(config["embed_keys"])}

    def state_dict(self) -> dict[str, Any]:
        """The steps and the settings, not the vectors (texts are re-encoded on load)."""
        window = self._window.state_dict()
        return {**self._state_header(), "config": self.config(), "window": window}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (the settings may differ: retrieval uses this memory's).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        self._window.load_state_dict(state["window"])
        for i in self._all_ids:
            self._clear(i)
        keys = self.settings.embed_keys
        # Re-encode the held steps of all envs step by step (one batch per step position).
        per_env = {i: self._window[i] for i in self._all_ids}
        longest = max((len(r) for r in per_env.values()), default=0)
        for t in range(longest):
            ids = [i for i in self._all_ids if len(per_env[i]) > t]
            texts = ["\n".join(str(per_env[i][t][k]) for k in keys) for i in ids]
            self._append(ids, texts, [self._window.first_step(i) - 1 + t for i in ids])

    def _check_queries(self, queries: Sequence[str | None] | None, n: int) -> None:
        if queries is not None:
            if isinstance(queries, (str, bytes)) or len(queries) != n:
                got = "a str" if isinstance(queries, (str, bytes)) else f"{len(queries)} values"
                raise ValueError(
                    f"queries must hold one str (or None) per env in env_ids ({n}), got {got}"
                )
            for q in queries:
                if q is not None and not isinstance(q, str):
                    raise ValueError(f"queries must hold str or None, got {type(q).__name__}")
        elif self.settings.query_source == "explicit" and self.settings.top_k:
            raise ValueError(
                "query_source='explicit' needs fetch(..., queries=[...]) with one query per env "
                "(e.g. the current observations)"
            )

    def _retrieve(
        self, hl: int, ids: list[int], queries: Sequence[str | None] | None
    ) -> dict[int, list[int]]:
        """Slot in ``ids`` -> held positions of the steps that env retrieves, best first."""
        if not self.settings.top_k:
            return {}
        qitems = self._encode_queries(queries)
        last_step = self.settings.query_source == "last_step"
        entries: list[Entry] = []
        slots: list[int] = []
        held = self._window.held_counts
        for j, i in enumerate(ids):
            n = held[i]
            w_lo = window_bounds(n, hl)
            if w_lo == 0:
                continue
            q = qitems[j] if qitems is not None else None
            qtext = queries[j] if queries is not None else None
            qwords = None
            if q is None and last_step:
                q = self._last_item[i]
                qwords = self._wordsets[i][-1] if self._wordsets[i] else None
            if q is not None:
                slots.append(j)
                entries.append((i, q, qtext, qwords, w_lo, n))
        return dict(zip(slots, self._rank(entries), strict=True))

    def _block(self, i: int, picked: list[int], label: int) -> Block | None:
        """Env ``i``'s block of retrieved steps (``label``: a chat step label's tokens)."""
        if not picked:
            return None
        window, fmt = self._window, self.formatter

        def costs() -> list[int]:
            return [t + label for t in window.tokens_at(i, picked)]

        def body(kept: Sequence[int]) -> str:
            order = sorted(kept)
            shown = window.renderings_at(i, order)
            if fmt.output != "messages":
                return fmt.join(shown)
            first = window.first_step(i)
            return "\n".join(
                f"Step {first + p}:\n{fmt.text_of(r)}".rstrip("\n")
                for p, r in zip(order, shown, strict=True)
            )

        return Block(picked, costs, body)

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"RetrievalMemory(num_envs={self.num_envs}, formatter={self.formatter!r}, "
            f"top_k={s.top_k}, encoder={self.encoder!r}, index={self.index_name!r}, "
            f"rerank={s.rerank!r}, max_history_tokens={self.max_history_tokens}, "
            f"capacity={self.capacity})"
        )

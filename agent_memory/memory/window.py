"""``HistoryMemory``: the window memory (strategies ``window``, ``none``, ``full``), and the
per-env step store every "block + window" strategy builds on.

Each step is rendered and its tokens counted once, when stored; ``fetch`` only slices cached
renderings and meets a token budget by binary search over prefix sums, so its cost depends on
the window, never on the episode's length. Step numbers stay absolute under ``capacity``.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise
from typing import Any

from agent_memory.formatting import Formatter, FormatterSpec, make_formatter
from agent_memory.memory.base import (
    UNSET,
    Budget,
    EnvIds,
    Fetched,
    RenderingMemory,
    check_budget,
    check_env_index,
    check_history_length,
    check_int,
    check_record_keys,
    check_window_fits,
    every_env,
    record_columns,
)
from agent_memory.memory.settings import WindowSettings
from agent_memory.tokens import TokenCounterSpec

__all__ = ["HistoryMemory"]


class HistoryMemory(RenderingMemory):
    """One history per env with a window, an optional token budget and optional bounded storage.

    Args:
        num_envs: number of environments.
        formatter: a registered formatter name, a ``{"name": ..., **kwargs}`` mapping, a Formatter.
        max_history_tokens: default token budget of :meth:`fetch` (``None``: no budget).
        token_counter: how tokens are counted (see :mod:`agent_memory.tokens`).
        capacity: keep only the newest ``capacity`` steps per env (``None``: the whole episode);
            ``fetch`` then refuses larger windows.

    Example:
        >>> mem = HistoryMemory(num_envs=2, formatter="simple")
        >>> for t in range(1, 4):
        ...     mem.store({"observation": [f"room {t}", f"hall {t}"], "action": ["go", "look"]})
        >>> mem.store({"observation": ["room 4"], "action": ["open"]}, env_ids=[0])
        >>> contexts, lengths = mem.fetch(history_length=2)
        >>> print(contexts[0])
        [Observation 3: 'room 3', Action 3: 'go']
        [Observation 4: 'room 4', Action 4: 'open']
        >>> lengths, mem.num_steps(1), mem[1][-1]
        ([2, 2], 3, {'observation': 'hall 3', 'action': 'look'})
        >>> mem.reset(env_ids=[0]); mem.num_steps(0), len(mem[1])
        (0, 3)
    """

    settings_class = WindowSettings

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
    ) -> None:
        super().__init__(num_envs, formatter, max_history_tokens, token_counter, capacity)
        # Per env: value tuples, renderings, token prefix sums (len = steps held + 1), steps
        # dropped from the front by bounded storage, and the episode's key tuple (None before
        # its first store).
        self._rows: list[list[tuple[Any, ...]]] = [[] for _ in self._all_ids]
        self._rendered: list[list[Any]] = [[] for _ in self._all_ids]
        self._cum: list[list[int]] = [[0] for _ in self._all_ids]
        self._start: list[int] = [0] * num_envs
        self._keys: list[tuple[str, ...] | None] = [None] * num_envs

    def reset(self, env_ids: EnvIds = None) -> None:
        """Clear the histories of ``env_ids`` (all when None); their next store is step 1."""
        for i in self._ids(env_ids):
            self._rows[i] = []
            self._rendered[i] = []
            self._cum[i] = [0]
            self._start[i] = 0
            self._keys[i] = None

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step for each env in ``env_ids`` (all when None); other envs do not advance.
        ``record``: key -> one value per env, in ``env_ids`` order (an episode's first store
        fixes its keys).

        Raises:
            TypeError: ``record`` is not a mapping of per-env sequences.
            ValueError: a value list of the wrong length, or keys that differ from the episode's
                (nothing is stored).
        """
        ids = self._ids(env_ids)
        columns = record_columns(record, len(ids))
        keys = tuple(columns)
        orders = self._check_keys(keys, ids)
        if not ids:
            return
        start, rows_l, rend_l, cum_l = self._start, self._rows, self._rendered, self._cum
        steps = [start[i] + len(cum_l[i]) for i in ids]  # cum holds one entry per step, plus one
        rendered = self._formatter.render_batch(columns, steps)
        counts = self._count_rendered(rendered)
        rows = list(zip(*columns.values(), strict=True))
        if orders is not None:  # some episodes listed their keys in another order
            rows = [
                row if o is None else tuple(row[p] for p in o)
                for row, o in zip(rows, orders, strict=True)
            ]
        for i, row, r, c in zip(ids, rows, rendered, counts, strict=True):
            rows_l[i].append(row)
            rend_l[i].append(r)
            cum = cum_l[i]
            cum.append(cum[-1] + c)
        cap = self.capacity
        if cap is not None:
            # Trim in amortised O(1): only once an env holds twice its capacity.
            for i in ids:
                if len(cum_l[i]) > 2 * cap + 1:
                    self._trim(i, cap)

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's context over the newest steps that the window and the budget allow.

        Args:
            history_length: -1 = the whole episode, 0 = none, k > 0 = the last k steps.
            env_ids: which envs (all when None), in the order of the returned lists.
            max_history_tokens: token budget (default: the memory's; ``None``: none; a sequence: one
                per env): the newest whole steps whose token counts fit are kept.
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        fmt = self._formatter
        # The default join is a plain str.join: call it directly (no Python frame per env).
        join = fmt.separator.join if type(fmt).join is Formatter.join else fmt.join
        rendered_l = self._rendered
        windows = rendered_l if every_env(ids) else [rendered_l[i] for i in ids]
        if budgets is None:  # the common case: a plain window, no per-env arithmetic
            if hl == 0:
                return Fetched([join([]) for _ in ids], [0] * len(ids))
            if hl > 0:
                windows = [w[-hl:] for w in windows]
            return Fetched(list(map(join, windows)), list(map(len, windows)))
        contexts: list[Any] = []
        lengths: list[int] = []
        for i, rendered, b in zip(ids, windows, budgets, strict=True):
            n = len(rendered)
            lo = self._window_lo(i, n, hl, b)
            contexts.append(join(rendered[lo:]))
            lengths.append(n - lo)
        return Fetched(contexts, lengths)

    def __getitem__(self, env_id: int) -> list[dict[str, Any]]:
        i = check_env_index(env_id, self.num_envs)
        keys = self._keys[i]
        if keys is None:  # no step stored in this episode
            return []
        return [dict(zip(keys, row, strict=True)) for row in self._held(self._rows[i])]

    def num_steps(self, env_id: int) -> int:
        i = check_env_index(env_id, self.num_envs)
        return self._start[i] + len(self._rows[i])

    @property
    def step_counts(self) -> list[int]:
        """:meth:`num_steps` of every env."""
        return [s + len(r) for s, r in zip(self._start, self._rows, strict=True)]

    # Positions count the steps env i holds (what ``memory[i]`` returns), oldest first:
    # 0 .. held(i) - 1; the step at position p is step number ``first_step(i) + p``.

    def held(self, env_id: int) -> int:
        """How many steps env ``env_id`` holds (``len(memory[i])``, at most :meth:`num_steps`)."""
        i = check_env_index(env_id, self.num_envs)
        return len(self._rows[i]) - self._dropped(i)

    @property
    def held_counts(self) -> list[int]:
        """:meth:`held` of every env."""
        cap = self.capacity
        if cap is None:
            return [len(r) for r in self._rows]
        return [min(len(r), cap) for r in self._rows]

    @property
    def first_steps(self) -> list[int]:
        """:meth:`first_step` of every env."""
        rows, held = map(len, self._rows), self.held_counts
        return [s + n - h + 1 for s, n, h in zip(self._start, rows, held, strict=True)]

    def first_step(self, env_id: int) -> int:
        """The step number of env ``env_id``'s oldest held step (``num_steps + 1``: none)."""
        i = check_env_index(env_id, self.num_envs)
        return self._start[i] + self._dropped(i) + 1

    def renderings(self, env_id: int, start: int = 0, stop: int | None = None) -> list[Any]:
        """The formatter's renderings (made at store time) of held steps ``[start, stop)``."""
        i = check_env_index(env_id, self.num_envs)
        off, n = self._dropped(i), len(self._rows[i])
        return self._rendered[i][off + start : n if stop is None else off + stop]

    def column(
        self, env_id: int, key: str, start: int = 0, stop: int | None = None
    ) -> list[Any] | None:
        """The values of ``key`` in env ``env_id``'s held steps ``[start, stop)`` (None when
        the episode's records have no such key): a record field without building records.

        Example:
            >>> mem = HistoryMemory(1)
            >>> for act in ("up", "down"):
            ...     mem.store({"observation": ["o"], "action": [act]})
            >>> mem.column(0, "action"), mem.column(0, "action", 1), mem.column(0, "thought")
            (['up', 'down'], ['down'], None)
        """
        i = check_env_index(env_id, self.num_envs)
        keys = self._keys[i]
        if keys is None or key not in keys:
            return None
        p, off, rows = keys.index(key), self._dropped(i), self._rows[i]
        return [row[p] for row in rows[off + start : len(rows) if stop is None else off + stop]]

    def renderings_at(self, env_id: int, positions: Sequence[int]) -> list[Any]:
        """The renderings of env ``env_id``'s held steps at ``positions`` (in that order)."""
        i = check_env_index(env_id, self.num_envs)
        off, rendered = self._dropped(i), self._rendered[i]
        return [rendered[off + p] for p in positions]

    def tokens_at(self, env_id: int, positions: Sequence[int]) -> list[int]:
        """The token counts of env ``env_id``'s held steps at ``positions`` (in that order).

        Example:
            >>> mem = HistoryMemory(1, token_counter="chars")
            >>> for obs in ("a", "bbb"):
            ...     mem.store({"observation": [obs], "action": ["x"]})
            >>> mem.tokens_at(0, [1, 0]), mem.renderings_at(0, [1])
            ([38, 36], ["[Observation 2: 'bbb', Action 2: 'x']"])
        """
        i = check_env_index(env_id, self.num_envs)
        off, cum = self._dropped(i), self._cum[i]
        return [cum[off + p + 1] - cum[off + p] for p in positions]

    def tokens(self, env_id: int, start: int = 0, stop: int | None = None) -> int:
        """Token count (made at store time) of held steps ``[start, stop)``, each with its
        separator: O(1), read off prefix sums.

        Example:
            >>> mem = HistoryMemory(1, token_counter="chars")
            >>> mem.store({"observation": ["a"], "action": ["b"]})
            >>> mem.tokens(0), mem.step_tokens(0), mem.renderings(0)
            (36, [36], ["[Observation 1: 'a', Action 1: 'b']"])
        """
        i = check_env_index(env_id, self.num_envs)
        off, cum = self._dropped(i), self._cum[i]
        return cum[len(cum) - 1 if stop is None else off + stop] - cum[off + start]

    def step_tokens(self, env_id: int) -> list[int]:
        """Token counts (made at store time) of the steps :meth:`__getitem__` returns."""
        cum = self._cum[check_env_index(env_id, self.num_envs)]
        return self._held([b - a for a, b in pairwise(cum)])

    def window_steps(
        self, env_id: int, history_length: int, max_history_tokens: int | None = None
    ) -> int:
        """How many of env ``env_id``'s newest steps ``fetch(history_length,
        max_history_tokens=...)`` shows (``max_history_tokens``: this env's budget, None for none,
        not the memory's default).

        Example:
            >>> mem = HistoryMemory(1, token_counter="chars")
            >>> for t in range(3):
            ...     mem.store({"observation": ["a"], "action": ["b"]})
            >>> mem.window_steps(0, -1), mem.window_steps(0, 2), mem.window_steps(0, -1, 80)
            (3, 2, 2)
        """
        hl = check_history_length(history_length)
        i = check_env_index(env_id, self.num_envs)
        check_window_fits(hl, self.capacity)
        n = len(self._rendered[i])
        return n - self._window_lo(i, n, hl, check_budget(max_history_tokens))

    def keep_newest(self, env_id: int, steps: int) -> None:
        """Drop all but env ``env_id``'s newest ``steps`` held steps (numbers stay absolute)."""
        i = check_env_index(env_id, self.num_envs)
        self._trim(i, check_int("steps", steps, 0))

    def set_formatter(self, formatter: FormatterSpec) -> None:
        """Switch formatter: re-renders (and re-counts) every stored step once."""
        self._formatter = make_formatter(formatter)
        for i in self._all_ids:
            self._rerender(i)

    def state_dict(self) -> dict[str, Any]:
        """A copy of everything needed to restore this memory (JSON-able if the records are)."""
        envs = []
        for i in self._all_ids:
            records, keys = self[i], self._keys[i]
            envs.append(
                {
                    "start": self.num_steps(i) - len(records),
                    "keys": None if keys is None else list(keys),
                    "records": copy.deepcopy(records),
                    "rendered": copy.deepcopy(self._held(self._rendered[i])),
                    "tokens": self.step_tokens(i),
                }
            )
        return self._state(envs)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (steps are re-rendered only when this memory's
        formatter or token counter differs from the saved one).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        same = (
            state.get("formatter") == self._formatter.spec()
            and state.get("token_counter") == self._counter.name
        )
        for i, env in enumerate(state["envs"]):
            keys = tuple(env["keys"] or ())  # () (saved as None): no step stored
            self._keys[i] = keys or None
            self._rows[i] = [tuple(copy.deepcopy(r[k]) for k in keys) for r in env["records"]]
            self._start[i] = int(env["start"])
            if same:
                self._rendered[i] = copy.deepcopy(list(env["rendered"]))
                self._cum[i] = list(accumulate(map(int, env["tokens"]), initial=0))
            else:
                self._rerender(i)
            if self.capacity is not None:
                self._trim(i, self.capacity)

    def _dropped(self, i: int) -> int:
        """Steps at the front of env ``i``'s lists that bounded storage no longer holds."""
        cap, n = self.capacity, len(self._rows[i])
        return n - cap if cap is not None and n > cap else 0

    def _window_lo(self, i: int, n: int, hl: int, budget: int | None) -> int:
        """Index (into env ``i``'s ``n`` listed steps) of the oldest step a fetch shows."""
        lo = 0 if hl == -1 else max(0, n - hl)
        if budget is not None and lo < n:
            cum = self._cum[i]
            # First index s >= lo whose suffix sum cum[n] - cum[s] fits the budget.
            lo = bisect_left(cum, cum[n] - budget, lo, n)
        return lo

    def _held(self, items: list[Any]) -> list[Any]:
        """The part of a per-env list that bounded storage still holds (trimming is lazy)."""
        if self.capacity is not None and len(items) > self.capacity:
            return items[-self.capacity :]
        return list(items)

    def _check_keys(
        self, keys: tuple[str, ...], ids: list[int]
    ) -> list[tuple[int, ...] | None] | None:
        """Check ``keys`` against each env's episode keys (raising before any change); fix them
        for envs starting an episode. Returns None, or per env the positions that put the values
        in its episode's order."""
        ep_keys = self._keys
        seen = check_record_keys(keys, ep_keys, ids, self._formatter)
        if seen == {keys}:
            return None
        orders: list[tuple[int, ...] | None] | None = None
        if seen - {None, keys}:  # some episodes listed their keys in another order
            orders = [None] * len(ids)
            for j, i in enumerate(ids):
                ep = ep_keys[i]
                if ep is not None and ep != keys:
                    orders[j] = tuple(keys.index(k) for k in ep)
        for i in ids:
            if ep_keys[i] is None:
                ep_keys[i] = keys
        return orders

    def _count_rendered(self, rendered: list[Any]) -> list[int]:
        """Token counts of rendered steps (the texts unbuilt for a counter of lengths)."""
        fmt = self._formatter
        count_length = getattr(self._counter, "count_length", None)
        plain = fmt.output == "text" and type(fmt).text_of is Formatter.text_of
        if count_length is not None and plain:
            sep = len(fmt.separator)
            return [count_length(len(r) + sep) for r in rendered]
        return self._counter.count_many(fmt.texts_of(rendered))

    def _trim(self, i: int, keep: int) -> None:
        drop = len(self._rows[i]) - keep
        if drop > 0:
            del self._rows[i][:drop]
            del self._rendered[i][:drop]
            del self._cum[i][:drop]
            self._start[i] += drop

    def _rerender(self, i: int) -> None:
        rows, keys = self._rows[i], self._keys[i]
        if not rows or keys is None:
            self._rendered[i], self._cum[i] = [], [0]
            return
        columns = {k: [row[p] for row in rows] for p, k in enumerate(keys)}
        steps = list(range(self._start[i] + 1, self._start[i] + len(rows) + 1))
        self._rendered[i] = rendered = self._formatter.render_batch(columns, steps)
        self._cum[i] = list(accumulate(self._count_rendered(rendered), initial=0))

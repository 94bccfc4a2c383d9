"""Strategies that show a block before each env's recent window: their base class and layout.

Retrieval, blackboard, episodic and compaction memories keep every env's steps in a
:class:`~agent_memory.memory.HistoryMemory` window (:class:`WindowedMemory`) and put a block of
their own before it; :class:`BlockLayout` joins block and window and splits a token budget
between them. ``lengths`` count the window's steps only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from agent_memory.formatting import Formatter, FormatterSpec
from agent_memory.memory.base import BaseMemory, EnvIds, Fetched, normalize_env_ids
from agent_memory.memory.window import HistoryMemory
from agent_memory.tokens import TokenCounter, TokenCounterSpec

__all__ = ["Block", "BlockLayout", "Priority", "WindowedMemory"]

#: Who gets a token budget first: ``"window"`` (the newest steps that fit; the block gets what is
#: left, and only when the whole window fits), ``"block"`` (the block's items that fit; the window
#: gets the rest) or ``"newest_step"`` (room for the newest step is kept, then the block, then the
#: window gets the rest).
Priority = Literal["window", "block", "newest_step"]


#: The memory arguments every strategy takes (the wrappers pass them to each).
_SHARED = ("num_envs", "formatter", "max_history_tokens", "token_counter", "capacity")


def _lines(items: Sequence[Any]) -> str:
    return "\n".join(items)


class Block(NamedTuple):
    """One env's block for one fetch (a tuple: made per env and fetch, it must be cheap).

    Attributes:
        items: what the block may show, the one to keep first first (a budget keeps a prefix).
        costs: each item's tokens (with the separator after it), or a callable giving them.
        body: the block's text (below the header) from the kept items; default: one per line.
    """

    items: Sequence[Any]
    costs: Sequence[int] | Callable[[], Sequence[int]]
    body: Callable[[Sequence[Any]], str] = _lines

    def item_costs(self) -> Sequence[int]:
        """:attr:`costs`, computed when given as a callable."""
        return self.costs() if callable(self.costs) else self.costs


@dataclass(frozen=True)
class BlockLayout:
    """How a block and an env's recent window make one context, within a token budget.

    Text: ``header`` line, the block, ``gap``, the ``window_header`` line, the window. Chat: one
    message (``role``) holding the header and the block, then the window's messages. A token
    budget is split as ``priority`` says.

    Args:
        header: the line that opens the block (``""``: none, the block carries its own).
        window_header: text contexts: the line between a block and a non-empty window.
        gap: text contexts: what separates the block from the window.
        role: chat contexts: the role of the block's message.
        priority: who gets the budget first (:data:`Priority`).

    Example:
        >>> layout = BlockLayout(header="Notes:", window_header="Recent steps:")
        >>> print(layout.compose("- the key is blue", "[step 9]", chat=False))
        Notes:
        - the key is blue
        Recent steps:
        [step 9]
        >>> layout.compose("- the key is blue", [], chat=True)
        [{'role': 'user', 'content': 'Notes:\\n- the key is blue'}]
    """

    header: str = ""
    window_header: str = ""
    gap: str = "\n"
    role: Literal["user", "system"] = "user"
    priority: Priority = "window"

    def overhead(self, counter: TokenCounter, chat: bool, uncovered: str = "") -> int:
        """Tokens a shown block adds besides its items: the header line and, in text contexts, the
        window header line and ``uncovered`` (a separator the items' costs leave out)."""
        text = f"{self.header}\n" if self.header else ""
        if not chat:
            text += uncovered + (f"{self.window_header}\n" if self.window_header else "")
        return counter(text) if text else 0

    def split(
        self,
        budget: int,
        costs: Sequence[int],
        overhead: int,
        window: Callable[[int | None], tuple[int, int]],
        newest: int,
    ) -> tuple[int, int]:
        """How many block items to keep and the window's budget, for one env.

        Args:
            budget: the env's token budget (block and window).
            costs: the block items' tokens, in keeping order.
            overhead: tokens a shown block adds besides its items (:meth:`overhead`).
            window: ``budget -> (steps, tokens)`` of the window shown with that budget (None: none).
            newest: tokens of the env's newest step (``"newest_step"`` priority).

        Example:
            >>> fit = lambda b: (2, 10) if b is None or b >= 10 else (1, 5) if b >= 5 else (0, 0)
            >>> BlockLayout(priority="window").split(14, [3, 3], 1, fit, 5)
            (1, 10)
            >>> BlockLayout(priority="block").split(14, [3, 3], 1, fit, 5)
            (2, 7)
        """
        if self.priority == "window":
            steps, tokens = window(budget)
            # Older context (retrieved steps, notes) never stands in for a newer window step.
            room = budget - tokens if steps == window(None)[0] else -1
        elif self.priority == "newest_step":
            room = budget - (newest if newest <= budget else 0)
        else:
            room = budget
        keep, spend = 0, overhead
        for cost in costs:
            spend += cost
            if spend > room:
                break
            keep += 1
        return keep, budget - (overhead + sum(costs[:keep]) if keep else 0)

    def compose(self, body: str, window: Any, chat: bool) -> Any:
        """The context of a block (``body``, below the header) and a joined ``window``."""
        return self._composer(chat)(body, window)

    def _composer(self, chat: bool) -> Callable[[str, Any], Any]:
        """:meth:`compose` for one kind of context, its fixed parts joined once."""
        head = f"{self.header}\n" if self.header else ""
        if chat:
            role = self.role
            return lambda body, window: [{"role": role, "content": head + body}, *window]
        mid = self.gap + (f"{self.window_header}\n" if self.window_header else "")
        return lambda body, window: f"{head}{body}{mid}{window}" if window else head + body

    def fetch(
        self,
        memory: HistoryMemory,
        history_length: int,
        ids: list[int],
        budgets: Sequence[int | None] | None,
        blocks: Sequence[Block | None],
        overhead: int | None = None,
    ) -> tuple[Fetched, list[int]]:
        """Each env's block and window from ``memory`` (``ids``: validated env ids; ``budgets``,
        ``blocks``: one per env or None; ``overhead``: as :meth:`overhead` gives it).

        Returns:
            The contexts with the window's lengths, and per env how many block items were kept.
        """
        kept = [0 if block is None else len(block.items) for block in blocks]
        if not any(kept):  # no env has a block: the plain window
            return memory.fetch(history_length, ids, max_history_tokens=budgets), kept
        inner = None if budgets is None else list(budgets)
        chat = memory.formatter.output == "messages"
        if inner is not None:
            if overhead is None:
                overhead = self.overhead(memory.token_counter, chat)
            for j, (i, block, b) in enumerate(zip(ids, blocks, inner, strict=True)):
                if b is None or not kept[j]:
                    continue
                assert block is not None

                def window(budget: int | None, i: int = i) -> tuple[int, int]:
                    steps = memory.window_steps(i, history_length, budget)
                    return steps, memory.tokens(i, memory.held(i) - steps)

                held = memory.held(i)
                newest = memory.tokens(i, held - 1) if held else 0
                kept[j], inner[j] = self.split(b, block.item_costs(), overhead, window, newest)
        base = memory.fetch(history_length, ids, max_history_tokens=inner)
        compose = self._composer(chat)
        contexts = base.contexts
        for j, (k, block) in enumerate(zip(kept, blocks, strict=True)):
            if k and block is not None:
                items, body = block.items, block.body
                text = items[0] if k == 1 and body is _lines else body(items[:k])
                contexts[j] = compose(text, contexts[j])
        return Fetched(contexts, base.lengths), kept


class WindowedMemory(BaseMemory):
    """A memory built around a :class:`~agent_memory.memory.HistoryMemory` window per env.

    Args:
        num_envs, formatter, max_history_tokens, token_counter, capacity: passed to the window.

    Subclasses implement :meth:`fetch` (usually with a :class:`BlockLayout`), :meth:`state_dict`
    and :meth:`load_state_dict`, and read the window through its public read API (:attr:`window`).

    Example:
        >>> class Shouting(WindowedMemory):
        ...     def fetch(self, history_length, env_ids=None, **kwargs):
        ...         ctx, n = self.window.fetch(history_length, env_ids, **kwargs)
        ...         return Fetched([c.upper() for c in ctx], n)
        ...     def state_dict(self):
        ...         return {**self._state_header(), "window": self.window.state_dict()}
        ...     def load_state_dict(self, state):
        ...         self._check_state(state)
        ...         self.window.load_state_dict(state["window"])
        >>> mem = Shouting(num_envs=2, capacity=3)
        >>> mem.store({"observation": ["a door"], "action": ["open"]}, env_ids=[1])
        >>> print(mem.fetch(1).contexts[1])
        [OBSERVATION 1: 'A DOOR', ACTION 1: 'OPEN']
        >>> mem[1], mem.step_counts, mem.capacity
        ([{'observation': 'a door', 'action': 'open'}], [0, 1], 3)
    """

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
    ) -> None:
        self._window = HistoryMemory(
            num_envs,
            formatter,
            max_history_tokens=max_history_tokens,
            token_counter=token_counter,
            capacity=capacity,
        )
        self.num_envs = num_envs
        self._all_ids = normalize_env_ids(None, num_envs)

    @staticmethod
    def _shared(arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The shared memory arguments among a subclass constructor's ``locals()``."""
        return {k: arguments[k] for k in _SHARED}

    @property
    def window(self) -> HistoryMemory:
        """The HistoryMemory holding every env's steps (the recent window is its fetch)."""
        return self._window

    @property
    def formatter(self) -> Formatter:
        """The formatter window steps are rendered with."""
        return self._window.formatter

    @property
    def token_counter(self) -> TokenCounter:
        """The token counter used for per-step counts and budgets."""
        return self._window.token_counter

    @property
    def max_history_tokens(self) -> int | None:
        """Default token budget of :meth:`fetch` (the whole context: block and window)."""
        return self._window.max_history_tokens

    @max_history_tokens.setter
    def max_history_tokens(self, value: int | None) -> None:
        self._window.max_history_tokens = value

    @property
    def capacity(self) -> int | None:
        """Steps kept per env (``None``: the whole episode)."""
        return self._window.capacity

    def set_formatter(self, formatter: FormatterSpec) -> None:
        """Switch formatter: re-renders every stored step once."""
        self._window.set_formatter(formatter)

    def reset(self, env_ids: EnvIds = None) -> None:
        """Clear the windows of ``env_ids`` (all when None) and what else each env holds."""
        ids = self._ids(env_ids)
        self._window.reset(ids)
        for i in ids:
            self._reset_env(i)

    def _reset_env(self, i: int) -> None:
        """Clear what a subclass keeps for env ``i`` besides its window (nothing by default)."""

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step per env to the window (see :meth:`HistoryMemory.store`)."""
        self._window.store(record, env_ids)

    def __getitem__(self, env_id: int) -> list[dict[str, Any]]:
        return self._window[env_id]

    def num_steps(self, env_id: int) -> int:
        return self._window.num_steps(env_id)

    @property
    def step_counts(self) -> list[int]:
        """:meth:`num_steps` of every env."""
        return self._window.step_counts

    def step_tokens(self, env_id: int) -> list[int]:
        """Token counts of env ``env_id``'s held steps (see :meth:`HistoryMemory.step_tokens`)."""
        return self._window.step_tokens(env_id)

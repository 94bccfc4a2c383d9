"""``CompactionMemory``: a window of recent steps plus a running summary of the older ones.

At store time (never in ``fetch``), an env past its trigger has all but its newest ``keep_last``
steps folded into its summary by a :class:`~agent_memory.memory.compaction.summarizers.Summarizer`
(one batched call for all envs due; on timeout or error the steps are dropped behind a marker).
Long observations are shown as a preview with an id, reloadable with ``load_offloaded``.
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agent_memory.formatting import Formatter, FormatterSpec, make_formatter
from agent_memory.memory.base import UNSET, Budget, EnvIds, Fetched, check_env_index
from agent_memory.memory.block_window import Block, BlockLayout, WindowedMemory
from agent_memory.memory.compaction.offload import Offloads, offload_id, previewing
from agent_memory.memory.compaction.runner import SummaryRunner, dropped_summary
from agent_memory.memory.compaction.settings import CompactionSettings
from agent_memory.memory.compaction.summarizers import (
    FoldedStep,
    Summarizer,
    SummaryRequest,
    fit_text,
    make_summarizer,
)
from agent_memory.memory.settings import SettingsAttributes
from agent_memory.tokens import TokenCounterSpec

__all__ = ["CompactionMemory"]


class CompactionMemory(SettingsAttributes[CompactionSettings], WindowedMemory):
    """Recent steps verbatim, older steps folded into a per-env summary (see the module docs).

    :attr:`events` records each compaction: ``env_id``, ``step``, ``trigger`` (``steps`` or
    ``tokens``), ``first_step`` / ``last_step`` / ``steps_folded``, ``tokens_before`` /
    ``tokens_after``, ``summary_tokens``, ``summarizer``, ``fallback`` (None, ``"timeout"``,
    ``"error"`` or ``"busy"``), ``error`` and ``duration_s``.

    Args:
        num_envs, formatter, max_history_tokens, token_counter: as for HistoryMemory.
        capacity: at most this many verbatim steps per env: a hard trigger (``None``: none).
        **settings: the fields of :class:`CompactionSettings`, each documented there.

    Raises:
        ValueError: bad configuration, e.g. ``keep_last >= trigger_steps`` or no trigger.

    Example:
        >>> mem = CompactionMemory(num_envs=1, trigger_steps=4, keep_last=2)
        >>> mem.store({"observation": ["Remember this: the key is RED."], "action": ["next"]})
        >>> for t in range(2, 6):
        ...     mem.store({"observation": [f"Fact {t}."], "action": ["next"]})
        >>> print(mem.fetch(history_length=2).contexts[0])
        Summary of steps 1-3:
        1: Remember this: the key is RED. -> next
        2: Fact 2. -> next
        3: Fact 3. -> next
        [Observation 4: 'Fact 4.', Action 4: 'next']
        [Observation 5: 'Fact 5.', Action 5: 'next']
        >>> e = mem.events[0]
        >>> e["steps_folded"], e["summarizer"], e["fallback"], mem.num_steps(0), len(mem[0])
        (3, 'extractive', None, 5, 2)
        >>> mem = CompactionMemory(num_envs=1, trigger_steps=4, keep_last=2, offload_chars=20,
        ...                        offload_preview=8)
        >>> mem.store({"observation": ["a log line " * 5], "action": ["read"]})
        >>> print(mem.fetch(1).contexts[0])
        [Observation 1: '[obs#1 offloaded: 55 chars; preview: a log li ...]', Action 1: 'read']
        >>> mem.offloaded_ids(0), mem.load_offloaded(0, "obs#1") == mem[0][0]["observation"]
        (['obs#1'], True)
    """

    settings_class = CompactionSettings

    #: 2: the window's state and the compaction's side by side.
    state_version: ClassVar[int] = 2

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
        self.settings = CompactionSettings(
            max_history_tokens=max_history_tokens, capacity=capacity, **settings
        )
        # Bounded storage is compaction's job here: the window keeps every step it is given.
        super().__init__(
            num_envs,
            self._previewing(formatter),
            max_history_tokens=max_history_tokens,
            token_counter=token_counter,
            capacity=None,
        )
        self.summarizer: Summarizer = make_summarizer(self.settings.summarizer)
        self._events: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=self.settings.max_events
        )
        self._totals = {"compactions": 0, "fallbacks": 0, "steps_folded": 0}
        # Per env: summary text, last step it covers (0 = none), its block (None: no summary),
        # offloaded observations (step -> text, oldest first).
        self._summary: list[str] = [""] * num_envs
        self._summary_upto: list[int] = [0] * num_envs
        self._block: list[Block | None] = [None] * num_envs
        self._offloaded = [Offloads() for _ in range(num_envs)]
        #: Env -> the summary its memory turn is to write (summarizer=policy), and its trigger.
        self._pending: dict[int, tuple[SummaryRequest, str]] = {}
        self._runner = SummaryRunner()
        self._formatter_changed()

    @property
    def events(self) -> list[dict[str, Any]]:
        """Recorded compaction events, oldest first (at most ``max_events``)."""
        return list(self._events)

    def pop_events(self) -> list[dict[str, Any]]:
        """The recorded events, clearing them (for reporters that read each event once)."""
        out = list(self._events)
        self._events.clear()
        return out

    @property
    def totals(self) -> dict[str, int]:
        """Counts since construction: ``compactions``, ``fallbacks``, ``steps_folded``."""
        return dict(self._totals)

    def wait_summarizer(self, timeout: float | None = None) -> bool:
        """Wait for a timed-out summarizer call that still runs; True when none runs (any more).

        While one runs, compactions fall back to truncation (``"busy"``).
        """
        return self._runner.wait(timeout)

    def summary(self, env_id: int) -> str:
        """Env ``env_id``'s summary text ("" before its first compaction)."""
        return self._summary[check_env_index(env_id, self.num_envs)]

    def summary_range(self, env_id: int) -> tuple[int, int]:
        """The steps the summary covers, ``(1, last)``; ``(0, 0)`` when there is none."""
        last = self._summary_upto[check_env_index(env_id, self.num_envs)]
        return (1, last) if last else (0, 0)

    def offloaded_ids(self, env_id: int) -> list[str]:
        """Ids of env ``env_id``'s offloaded observations still held, oldest first."""
        return self._offloaded[check_env_index(env_id, self.num_envs)].ids()

    def load_offloaded(self, env_id: int, obs_id: str | int) -> str:
        """The full text of an offloaded observation, by id (``"obs#3"``) or step number.

        Raises:
            KeyError: no such offloaded observation in the env's current episode.
        """
        i = check_env_index(env_id, self.num_envs)
        return self._offloaded[i].load(obs_id, i)

    def turn_prompts(self, env_ids: Sequence[int]) -> dict[int, str]:
        """``summarizer=policy``: the summary prompts the envs of ``env_ids`` wait for (their
        steps due stay verbatim until :meth:`answer_turns`)."""
        pending, build = self._pending, getattr(self.summarizer, "build_prompt", None)
        if not pending or build is None:
            return {}
        return {i: build(pending[i][0]) for i in env_ids if i in pending}

    def answer_turns(self, answers: Mapping[int, str]) -> dict[int, str | None]:
        """Fold each env's steps due into the summary the policy wrote (an empty one: behind a
        truncation marker, the reason returned)."""
        out: dict[int, str | None] = {}
        for i, text in answers.items():
            if i not in self._pending:
                raise ValueError(
                    f"env {i} waits for no memory turn (answers for {sorted(answers)})"
                )
            request, trigger = self._pending.pop(i)
            text = str(text).strip()
            out[i] = None if text else "the policy wrote an empty summary"
            self._fold(i, trigger, request, text or None, out[i] and "error", out[i], 0.0)
        return out

    def _reset_env(self, i: int) -> None:
        self._pending.pop(i, None)
        self._summary[i] = ""
        self._summary_upto[i] = 0
        self._block[i] = None
        self._offloaded[i] = Offloads()

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Store one step per env (long observations as previews), then compact the envs due."""
        ids = self._ids(env_ids)
        self._window.store(record, ids)  # validates; nothing is stored when it raises
        limit, key = self.settings.offload_chars, self._obs_key
        if limit is not None and key in record:
            column = record[key]
            for j in [j for j, o in enumerate(column) if isinstance(o, str) and len(o) > limit]:
                i = ids[j]
                steps = self._window.num_steps(i)
                self._offloaded[i].add(steps, column[j], self.settings.offload_capacity)
        self._maybe_compact(ids)

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Summary block + the newest verbatim steps the window and the budget allow.

        Args:
            history_length: verbatim steps: -1 all held, 0 none (and no summary), k the last k.
            env_ids: which envs (all when None).
            max_history_tokens: token budget of the whole context (as for
                :meth:`HistoryMemory.fetch`): first the newest step, then the summary, then
                older steps. ``lengths`` count verbatim steps.
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        blocks = [self._block[i] for i in ids]
        if hl == 0 or not any(blocks):
            return self._window.fetch(hl, ids, max_history_tokens=budgets)
        return self.layout.fetch(self._window, hl, ids, budgets, blocks)[0]

    def set_formatter(self, formatter: FormatterSpec) -> None:
        """Switch formatter: re-renders every held step (previews kept) and the summaries."""
        self._window.set_formatter(self._previewing(formatter))
        self._formatter_changed()

    def state_dict(self) -> dict[str, Any]:
        """The held steps, summaries, offloaded observations, events and totals."""
        return {
            **self._state_header(),
            "window": self._window.state_dict(),
            "envs": [
                {
                    "summary": self._summary[i],
                    "summary_upto": self._summary_upto[i],
                    # JSON object keys are strings.
                    "offloaded": {str(s): t for s, t in self._offloaded[i].items()},
                }
                for i in self._all_ids
            ],
            "events": copy.deepcopy(list(self._events)),
            "totals": dict(self._totals),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (of a ``CompactionMemory`` with as many envs).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        self._window.load_state_dict(state["window"])
        for i, env in enumerate(state["envs"]):
            self._offloaded[i] = Offloads({int(s): str(t) for s, t in env["offloaded"].items()})
            self._summary[i] = str(env["summary"])
            self._summary_upto[i] = int(env["summary_upto"])
            self._render_block(i)
        self._events = collections.deque(
            copy.deepcopy(list(state["events"])), maxlen=self.settings.max_events
        )
        self._totals = {k: int(v) for k, v in state["totals"].items()}

    def _maybe_compact(self, ids: Sequence[int]) -> None:
        s, window = self.settings, self._window
        keep, trig, cap = s.keep_last, s.trigger_steps, s.capacity
        if cap is not None:
            trig = cap if trig is None else min(trig, cap)
        limit = None
        if s.trigger_ratio is not None and self.max_history_tokens is not None:
            limit = s.trigger_ratio * self.max_history_tokens
        held_l = window.held_counts
        if self._pending:  # an env waiting for its memory turn keeps its steps until then
            ids = [i for i in ids if i not in self._pending]
        due: list[tuple[int, str]] = []
        if limit is None:  # the usual case: a step trigger only (the settings ensure one)
            assert trig is not None
            due = [(i, "steps") for i in ids if held_l[i] > trig]
        else:
            for i in ids:
                held = held_l[i]
                if held <= keep:
                    continue
                if trig is not None and held > trig:
                    due.append((i, "steps"))
                elif window.tokens(i) + self._block_tokens(i) > limit:
                    due.append((i, "tokens"))
        if due:
            self._compact(due)

    def _block_tokens(self, i: int) -> int:
        block = self._block[i]
        return 0 if block is None else block.item_costs()[0]

    def _compact(self, due: list[tuple[int, str]]) -> None:
        s, window, counter = self.settings, self._window, self.token_counter
        requests = []
        for i, _ in due:
            folded = self._folded_steps(i, window.held(i) - s.keep_last)
            requests.append(SummaryRequest(self._summary[i], folded, s.summary_max_tokens))
        if self.summarizer.turn:  # the acting policy writes it, as a turn (turn_prompts)
            self._pending.update((i, (r, t)) for (i, t), r in zip(due, requests, strict=True))
            return
        t0 = time.perf_counter()
        summaries, fallback, error = self._runner.run(
            self.summarizer, requests, counter, s.summary_timeout
        )
        duration = time.perf_counter() - t0
        for k, (i, trigger) in enumerate(due):
            summary = None if summaries is None else str(summaries[k])
            self._fold(i, trigger, requests[k], summary, fallback, error, duration)

    def _fold(
        self,
        i: int,
        trigger: str,
        request: SummaryRequest,
        summary: str | None,
        fallback: str | None,
        error: str | None,
        duration: float,
    ) -> None:
        """Replace env ``i``'s folded steps by ``summary`` (None: a truncation marker)."""
        s, window, counter = self.settings, self._window, self.token_counter
        steps = request.steps
        first, last = steps[0].step, steps[-1].step
        before = window.tokens(i) + self._block_tokens(i)
        if summary is not None:
            text = fit_text(summary, s.summary_max_tokens, counter)
        else:
            text = dropped_summary(self._summary[i], first, last, s.summary_max_tokens, counter)
        window.keep_newest(i, s.keep_last)
        self._summary[i] = text
        self._summary_upto[i] = last
        self._render_block(i)
        after = window.tokens(i) + self._block_tokens(i)
        self._totals["compactions"] += 1
        self._totals["steps_folded"] += len(steps)
        self._totals["fallbacks"] += fallback is not None
        if s.max_events:
            self._events.append(
                {
                    "env_id": i,
                    "step": self.num_steps(i),
                    "trigger": trigger,
                    "first_step": first,
                    "last_step": last,
                    "steps_folded": len(steps),
                    "tokens_before": before,
                    "tokens_after": after,
                    "summary_tokens": counter(text) if text else 0,
                    "summarizer": self.summarizer.name,
                    "fallback": fallback,
                    "error": error,
                    "duration_s": duration,
                }
            )

    def _folded_steps(self, i: int, k: int) -> list[FoldedStep]:
        """Env ``i``'s oldest ``k`` held steps, as a summarizer gets them."""
        window = self._window
        obs = window.column(i, self._obs_key, 0, k)
        acts = window.column(i, self._action_key, 0, k)
        thoughts = window.column(i, "thought", 0, k)
        if self.summarizer.reads_text or obs is None:
            texts = self.formatter.texts_of(window.renderings(i, 0, k))
        else:
            texts = [""] * k
        start, offl = window.first_step(i), self._offloaded[i]
        out = []
        for j, text in enumerate(texts):
            step, thought = start + j, None if thoughts is None else thoughts[j]
            out.append(
                FoldedStep(
                    step,
                    text,
                    observation=None if obs is None else str(obs[j]),
                    action=None if acts is None else str(acts[j]),
                    thought=None if thought is None else str(thought),
                    offload_id=offload_id(step) if step in offl else None,
                )
            )
        return out

    def _previewing(self, formatter: FormatterSpec) -> Formatter:
        """``formatter``, showing observations longer than ``offload_chars`` as previews."""
        fmt = make_formatter(formatter)
        limit = self.settings.offload_chars
        return fmt if limit is None else previewing(fmt, limit, self.settings.offload_preview)

    def _formatter_changed(self) -> None:
        fmt = self.formatter
        self._chat = fmt.output == "messages"
        self._block_sep = fmt.separator or "\n"
        self._obs_key = getattr(fmt, "obs_key", "observation")
        self._action_key = getattr(fmt, "action_key", "action")
        # The block is written with its header; the formatter's separator parts it from the window.
        self.layout = BlockLayout(
            gap=self._block_sep, role=self.settings.summary_role, priority="newest_step"
        )
        for i in self._all_ids:
            self._render_block(i)

    def _render_block(self, i: int) -> None:
        upto = self._summary_upto[i]
        if not upto:
            self._block[i] = None
            return
        text = self.settings.summary_header.format(first=1, last=upto)
        if self._summary[i]:
            text += "\n" + self._summary[i]
        tokens = self.token_counter(text + ("\n" if self._chat else self._block_sep))
        self._block[i] = Block([text], [tokens])

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"CompactionMemory(num_envs={self.num_envs}, formatter={self.formatter!r}, "
            f"max_history_tokens={self.max_history_tokens}, trigger_steps={s.trigger_steps}, "
            f"trigger_ratio={s.trigger_ratio}, keep_last={s.keep_last}, "
            f"summarizer={self.summarizer!r}, summary_max_tokens={s.summary_max_tokens})"
        )

"""``CompactionMemory``: a window of recent steps plus a running summary of the older ones.

After AgentScope's ``AutoContextMemory`` and MARSYS's managed memory, done per env and batched:

* **When**: at store time (amortised, never inside ``fetch``), for each env that holds more than
  ``trigger_steps`` verbatim steps, or whose verbatim steps plus summary exceed
  ``trigger_ratio * max_tokens`` tokens (or more than ``capacity`` steps, a hard cap).
* **What**: the newest ``keep_last`` steps stay verbatim; the older ones are folded into the env's
  running summary by a pluggable :class:`~agent_memory.memory.summarizers.Summarizer` (one
  batched call for all envs due at that store). The summary is kept within
  ``summary_max_tokens``.
* **Never blocks forever**: a summarizer that may block (a model call) runs in a worker thread
  with ``summary_timeout``; on timeout or error the folded steps are dropped and the summary
  gets a ``"[k earlier steps dropped (steps a-b)]"`` marker instead. Every compaction is
  recorded in :attr:`CompactionMemory.events` (env, step, tokens before/after, steps folded,
  summarizer, fallback, duration).
* **Offloading**: an observation longer than ``offload_chars`` is shown in the context as a
  preview with an id (``[obs#3 offloaded: 2,048 chars; preview: ...]``); the full text stays in
  the memory (and its state) and :meth:`CompactionMemory.load_offloaded` returns it.
  ``memory[i]`` keeps the full observations.

``fetch`` returns the summary block (``"Summary of steps 1-20:\\n..."``; with a chat formatter
a leading user or system message) followed by the verbatim window: ``history_length`` limits the
verbatim part, step numbers stay absolute, and a token budget covers the whole context, summary
included, whole steps only. The budget goes to the newest step, then the summary, then older
steps: a summary is left out when it does not fit next to the newest step. Lengths count
verbatim steps. An env holds between ``keep_last`` and
``trigger_steps`` verbatim steps; with a window shorter than that, the held steps between the
summary and the window are not shown (step numbers make the gap visible): choose
``trigger_steps`` close to ``history_length`` when the gap matters, at the price of more
frequent (smaller) compactions.

Event fields: ``env_id``, ``step`` (the env's step count), ``trigger`` (``steps`` or ``tokens``),
``first_step`` / ``last_step`` / ``steps_folded``, ``tokens_before`` / ``tokens_after`` (verbatim
steps plus summary block), ``summary_tokens``, ``summarizer`` (its name), ``fallback`` (None,
``"timeout"``, ``"error"`` or ``"busy"``: a timed-out call still running), ``error`` (the reason)
and ``duration_s`` (the batched summarizer call that served this event).
"""

from __future__ import annotations

import collections
import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import (
    UNSET,
    EnvIds,
    Fetched,
    check_capacity,
    check_env_index,
    check_history_length,
    check_int,
    check_number,
    normalize_env_ids,
    resolve_budgets,
)
from agent_memory.memory.history import HistoryMemory
from agent_memory.memory.offload import Offloading, Offloads, offload_id
from agent_memory.memory.summarizers import (
    FoldedStep,
    Summarizer,
    SummarizerSpec,
    SummaryRequest,
    fit_text,
    make_summarizer,
)
from agent_memory.memory.summary_runner import SummaryRunner, dropped_summary
from agent_memory.tokens import TokenCounterSpec

__all__ = ["CompactionMemory"]

_STATE_VERSION = 1


class CompactionMemory(Offloading, HistoryMemory):
    """Recent steps verbatim, older steps folded into a per-env summary (see the module docs).

    Args:
        num_envs, formatter, max_tokens, token_counter: as for
            :class:`~agent_memory.memory.HistoryMemory` (``max_tokens`` is also what
            ``trigger_ratio`` is a fraction of).
        capacity: at most this many verbatim steps per env: a hard compaction trigger
            (``None``: only the triggers below).
        trigger_steps: compact an env once it holds more than this many verbatim steps
            (``None``: no step trigger).
        trigger_ratio: compact an env once its verbatim steps plus summary exceed this fraction
            of ``max_tokens`` (ignored when ``max_tokens`` is None).
        keep_last: verbatim steps kept at each compaction (the rest is folded).
        summarizer: ``"extractive"`` (default, no model), ``"llm"`` (with a ``policy``), a
            ``{"name": ..., **params}`` mapping or a :class:`Summarizer`.
        summary_max_tokens: token budget of each env's summary text.
        summary_timeout: seconds a blocking summarizer may take per compaction (``None``: no
            limit, run inline).
        summary_role: chat formatters only: the role of the summary message.
        summary_header: first line of the summary block (``{first}``/``{last}`` = step range).
        offload_chars: observations longer than this are offloaded (``None``: never).
        offload_preview: characters of an offloaded observation shown in the context (at most
            ``offload_chars``).
        offload_capacity: offloaded texts kept per env (oldest evicted; ``None``: all of the
            episode).
        max_events: compaction events kept in :attr:`events` (oldest dropped).

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
    """

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        trigger_steps: int | None = 20,
        trigger_ratio: float | None = 0.8,
        keep_last: int = 5,
        summarizer: SummarizerSpec = "extractive",
        summary_max_tokens: int = 256,
        summary_timeout: float | None = 30.0,
        summary_role: Literal["user", "system"] = "user",
        summary_header: str = "Summary of steps {first}-{last}:",
        offload_chars: int | None = 4000,
        offload_preview: int = 200,
        offload_capacity: int | None = None,
        max_events: int = 1000,
    ) -> None:
        # Bounded storage is compaction's job here: the parent keeps every step it is given.
        super().__init__(
            num_envs, formatter, max_tokens=max_tokens, token_counter=token_counter, capacity=None
        )
        check_int("keep_last", keep_last, 1)
        trigger_steps = check_int("trigger_steps", trigger_steps, 1, allow_none=True)
        capacity = check_capacity(capacity)  # the verbatim cap: a compaction trigger here
        for name, value in (("trigger_steps", trigger_steps), ("capacity", capacity)):
            if value is not None and keep_last >= value:
                raise ValueError(
                    f"keep_last must be < {name} (compaction keeps keep_last steps verbatim and "
                    f"folds the rest once more than {name} are held), got keep_last={keep_last}, "
                    f"{name}={value}"
                )
        check_number("trigger_ratio", trigger_ratio, low=0, high=1, low_open=True, allow_none=True)
        if (
            trigger_steps is None
            and capacity is None
            and (trigger_ratio is None or max_tokens is None)
        ):
            raise ValueError(
                "compaction needs a trigger: set trigger_steps, capacity, or trigger_ratio "
                f"together with max_tokens; got trigger_steps=None, capacity=None, "
                f"trigger_ratio={trigger_ratio!r}, max_tokens={max_tokens!r}"
            )
        check_int("summary_max_tokens", summary_max_tokens, 16)
        if (
            trigger_ratio is not None
            and max_tokens is not None
            and summary_max_tokens >= trigger_ratio * max_tokens
        ):
            raise ValueError(
                f"summary_max_tokens must be < trigger_ratio * max_tokens (the summary alone "
                "would keep the token trigger firing), got summary_max_tokens="
                f"{summary_max_tokens}, trigger_ratio * max_tokens = {trigger_ratio * max_tokens:g}"
            )
        check_number("summary_timeout", summary_timeout, low=0, low_open=True, allow_none=True)
        if summary_role not in ("user", "system"):
            raise ValueError(f"summary_role must be 'user' or 'system', got {summary_role!r}")
        try:
            summary_header.format(first=1, last=2)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"summary_header may use only {{first}} and {{last}}, got {summary_header!r} ({e})"
            ) from None
        offload_chars = check_int("offload_chars", offload_chars, 1, allow_none=True)
        check_int("offload_preview", offload_preview, 0)
        offload_capacity = check_int("offload_capacity", offload_capacity, 1, allow_none=True)
        check_int("max_events", max_events, 0)

        self.keep_last = keep_last
        self.trigger_steps = trigger_steps
        self.trigger_ratio = None if trigger_ratio is None else float(trigger_ratio)
        self.verbatim_capacity = capacity
        self.summarizer: Summarizer = make_summarizer(summarizer)
        self.summary_max_tokens = summary_max_tokens
        self.summary_timeout = None if summary_timeout is None else float(summary_timeout)
        self.summary_role = summary_role
        self.summary_header = summary_header
        self.offload_chars = offload_chars
        self.offload_preview = offload_preview
        self.offload_capacity = offload_capacity
        self.max_events = max_events
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_events)
        self._totals = {"compactions": 0, "fallbacks": 0, "steps_folded": 0}
        # Per env: summary text, last step it covers (0 = none), rendered block and its tokens,
        # offloaded observations (step -> text, oldest first).
        self._summary: list[str] = [""] * num_envs
        self._summary_upto: list[int] = [0] * num_envs
        self._block: list[Any] = [None] * num_envs
        self._block_tokens: list[int] = [0] * num_envs
        self._offloaded = [Offloads() for _ in range(num_envs)]
        self._runner = SummaryRunner()
        self._formatter_changed()

    # ------------------------------------------------------------------ public extras

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

        While one runs, compactions fall back to truncation (``"busy"``) rather than start
        another call behind it.
        """
        return self._runner.wait(timeout)

    def summary(self, env_id: int) -> str:
        """Env ``env_id``'s summary text ("" before its first compaction)."""
        return self._summary[check_env_index(env_id, self.num_envs)]

    def summary_range(self, env_id: int) -> tuple[int, int]:
        """The steps the summary covers, ``(1, last)``; ``(0, 0)`` when there is none."""
        last = self._summary_upto[check_env_index(env_id, self.num_envs)]
        return (1, last) if last else (0, 0)

    # ------------------------------------------------------------------ contract

    def reset(self, env_ids: EnvIds = None) -> None:
        ids = normalize_env_ids(env_ids, self.num_envs)  # None: all envs
        super().reset(ids)
        for i in ids:
            self._summary[i] = ""
            self._summary_upto[i] = 0
            self._block[i] = None
            self._block_tokens[i] = 0
            self._offloaded[i] = Offloads()

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Store one step per env (as :meth:`HistoryMemory.store`), offloading large observations,
        then compact the envs whose triggers fire."""
        ids = normalize_env_ids(env_ids, self.num_envs)  # None: all envs
        self._store_offloading(record, env_ids, ids)  # validates; nothing is stored when it raises
        self._maybe_compact(ids)

    def fetch(
        self,
        history_length: int,
        env_ids: EnvIds = None,
        *,
        max_tokens: int | Sequence[int | None] | None = UNSET,
    ) -> Fetched:
        """Summary block + the newest verbatim steps the window and the budget allow.

        Args:
            history_length: verbatim steps: -1 all held, 0 none (and no summary), k the last k.
            env_ids: which envs (all when None).
            max_tokens: token budget of the whole context, summary included (overrides the
                memory's default; ``None`` = no budget; a sequence = one per env). It goes to
                the newest step, then the summary, then older steps (whole steps only).

        Returns:
            ``Fetched(contexts, lengths)``; lengths count verbatim steps.
        """
        hl = check_history_length(history_length)
        ids = normalize_env_ids(env_ids, self.num_envs)  # None: all envs
        budgets = resolve_budgets(max_tokens, len(ids), self.max_tokens)
        blocks = self._block
        if hl == 0 or all(blocks[i] is None for i in ids):
            return super().fetch(hl, env_ids, max_tokens=budgets)
        block_tokens, cum_l = self._block_tokens, self._cum
        use = []
        inner = None if budgets is None else list(budgets)
        for j, i in enumerate(ids):
            b = None if budgets is None else budgets[j]
            ok = blocks[i] is not None
            if ok and b is not None:
                # The newest step first, then the summary, then older steps: a summary never
                # crowds out the whole window.
                cum = cum_l[i]
                newest = cum[-1] - cum[-2] if len(cum) > 1 else 0
                ok = block_tokens[i] + (newest if newest <= b else 0) <= b
                if ok:
                    inner[j] = b - block_tokens[i]  # type: ignore[index]
            use.append(ok)
        contexts, lengths = super().fetch(hl, env_ids, max_tokens=inner)
        if self._chat:
            for j, i in enumerate(ids):
                if use[j]:
                    contexts[j] = [dict(blocks[i]), *contexts[j]]
        else:
            sep = self._block_sep
            for j, i in enumerate(ids):
                if use[j]:
                    contexts[j] = blocks[i] + sep + contexts[j] if lengths[j] else blocks[i]
        return Fetched(contexts, lengths)

    # ------------------------------------------------------------------ formatter

    def set_formatter(self, formatter: FormatterSpec) -> None:
        """Switch formatter: re-renders every held step (previews kept) and the summaries."""
        super().set_formatter(formatter)
        self._formatter_changed()
        for i in range(self.num_envs):
            self._render_block(i)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`load_state_dict` needs (JSON-able if the records are): the held
        steps, summaries, offloaded observations, events and totals."""
        state = super().state_dict()
        state["compaction"] = {
            "version": _STATE_VERSION,
            "envs": [
                {
                    "summary": self._summary[i],
                    "summary_upto": self._summary_upto[i],
                    # JSON object keys are strings.
                    "offloaded": {str(s): t for s, t in self._offloaded[i].items()},
                }
                for i in range(self.num_envs)
            ],
            "events": copy.deepcopy(list(self._events)),
            "totals": dict(self._totals),
        }
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (of a ``CompactionMemory`` with as many envs).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        extra = state.get("compaction")
        if state.get("kind") != type(self).__name__ or not isinstance(extra, Mapping):
            raise ValueError(
                f"cannot load state: expected kind={type(self).__name__!r} with a 'compaction' "
                f"section, got kind={state.get('kind')!r}"
            )
        if extra.get("version") != _STATE_VERSION:
            raise ValueError(
                f"cannot load state: expected compaction version={_STATE_VERSION!r}, "
                f"got {extra.get('version')!r}"
            )
        if state.get("num_envs") != self.num_envs or len(extra["envs"]) != self.num_envs:
            raise ValueError(
                f"cannot load state: expected num_envs={self.num_envs!r}, "
                f"got {state.get('num_envs')!r}"
            )
        # Offloads first: re-rendering (another formatter) shows their previews.
        for i, env in enumerate(extra["envs"]):
            self._offloaded[i] = Offloads({int(s): str(t) for s, t in env["offloaded"].items()})
        super().load_state_dict(state)
        for i, env in enumerate(extra["envs"]):
            self._summary[i] = str(env["summary"])
            self._summary_upto[i] = int(env["summary_upto"])
            self._render_block(i)
        self._events = collections.deque(
            copy.deepcopy(list(extra["events"])), maxlen=self.max_events
        )
        self._totals = {k: int(v) for k, v in extra["totals"].items()}

    # ------------------------------------------------------------------ compaction

    def _maybe_compact(self, ids: Sequence[int]) -> None:
        keep, rows_l = self.keep_last, self._rows
        trig = self.trigger_steps
        cap = self.verbatim_capacity
        if cap is not None:
            trig = cap if trig is None else min(trig, cap)
        limit = None
        if self.trigger_ratio is not None and self.max_tokens is not None:
            limit = self.trigger_ratio * self.max_tokens
        due: list[tuple[int, str]] = []
        if limit is None:
            assert trig is not None
            due = [(i, "steps") for i in ids if len(rows_l[i]) > trig]
        else:
            cum_l, blk = self._cum, self._block_tokens
            for i in ids:
                held = len(rows_l[i])
                if held <= keep:
                    continue
                if trig is not None and held > trig:
                    due.append((i, "steps"))
                elif cum_l[i][-1] - cum_l[i][0] + blk[i] > limit:
                    due.append((i, "tokens"))
        if due:
            self._compact(due)

    def _compact(self, due: list[tuple[int, str]]) -> None:
        keep = self.keep_last
        requests = []
        for i, _ in due:
            folded = self._folded_steps(i, len(self._rows[i]) - keep)
            requests.append(SummaryRequest(self._summary[i], folded, self.summary_max_tokens))
        t0 = time.perf_counter()
        summaries, fallback, error = self._runner.run(
            self.summarizer, requests, self._counter, self.summary_timeout
        )
        duration = time.perf_counter() - t0
        for k, (i, trigger) in enumerate(due):
            steps = requests[k].steps
            first, last = steps[0].step, steps[-1].step
            before = self._cum[i][-1] - self._cum[i][0] + self._block_tokens[i]
            if summaries is not None:
                text = fit_text(str(summaries[k]), self.summary_max_tokens, self._counter)
            else:
                text = dropped_summary(
                    self._summary[i], first, last, self.summary_max_tokens, self._counter
                )
            self._trim(i, keep)
            self._summary[i] = text
            self._summary_upto[i] = last
            self._render_block(i)
            after = self._cum[i][-1] - self._cum[i][0] + self._block_tokens[i]
            self._totals["compactions"] += 1
            self._totals["steps_folded"] += len(steps)
            self._totals["fallbacks"] += fallback is not None
            if self.max_events:
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
                        "summary_tokens": self._counter(text) if text else 0,
                        "summarizer": self.summarizer.name,
                        "fallback": fallback,
                        "error": error,
                        "duration_s": duration,
                    }
                )

    def _folded_steps(self, i: int, k: int) -> list[FoldedStep]:
        keys = self._keys[i]
        assert keys is not None
        pos = {name: p for p, name in enumerate(keys)}
        po, pa, pt = pos.get(self._obs_key), pos.get(self._action_key), pos.get("thought")
        start = self._start[i]
        offl = self._offloaded[i]
        if self.summarizer.reads_text or po is None:
            texts = self._formatter.texts_of(self._rendered[i][:k])
        else:
            texts = [""] * k
        out = []
        for j, (row, text) in enumerate(zip(self._rows[i][:k], texts, strict=True)):
            step = start + j + 1
            out.append(
                FoldedStep(
                    step=step,
                    text=text,
                    observation=None if po is None else str(row[po]),
                    action=None if pa is None else str(row[pa]),
                    thought=None if pt is None or row[pt] is None else str(row[pt]),
                    offload_id=offload_id(step) if step in offl else None,
                )
            )
        return out

    # ------------------------------------------------------------------ rendering

    def _formatter_changed(self) -> None:
        fmt = self._formatter
        self._chat = fmt.output == "messages"
        self._block_sep = fmt.separator or "\n"
        self._obs_key = getattr(fmt, "obs_key", "observation")
        self._action_key = getattr(fmt, "action_key", "action")

    def _render_block(self, i: int) -> None:
        upto = self._summary_upto[i]
        if not upto:
            self._block[i], self._block_tokens[i] = None, 0
            return
        text = self.summary_header.format(first=1, last=upto)
        if self._summary[i]:
            text += "\n" + self._summary[i]
        if self._chat:
            self._block[i] = {"role": self.summary_role, "content": text}
            self._block_tokens[i] = self._counter(text + "\n")
        else:
            self._block[i] = text
            self._block_tokens[i] = self._counter(text + self._block_sep)

    def __repr__(self) -> str:
        return (
            f"CompactionMemory(num_envs={self.num_envs}, formatter={self._formatter!r}, "
            f"max_tokens={self.max_tokens}, trigger_steps={self.trigger_steps}, "
            f"trigger_ratio={self.trigger_ratio}, keep_last={self.keep_last}, "
            f"summarizer={self.summarizer!r}, summary_max_tokens={self.summary_max_tokens})"
        )

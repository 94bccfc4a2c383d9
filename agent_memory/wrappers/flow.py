"""The step flow both wrappers share (the single-env one runs it over one env), per acting env:

1. intercept: a memory action (``<record>``, ``<retrieve>``) goes to the memory (its reply to
   ``info["memory_reply"]``); the env gets the no-op;
2. parse: any other response becomes the env's action, or an invalid verdict (its tag, or with
   ``parser.tool_calls`` its tool calls: :mod:`agent_memory.tool_actions`);
3. fallback: an invalid response's env gets the fallback action, or its own text with the
   parser's ``on_invalid="raw"`` (end of :meth:`StepFlow.plan`);
4. store: the observation acted on, the action as shown, the thought and the extras;
5. verdict: the parser's, then the env's own (``info["is_action_valid"]``);
6. penalty: ``invalid_penalty`` added to invalid steps' rewards (end of :meth:`StepFlow.record`);
7. hand-over of ended episodes, done by the wrappers (*when* depends on the autoreset mode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser, ParsedAction
from agent_memory.protocol import INVALID_REASON, IS_ACTION_VALID
from agent_memory.text import utf8_safe
from agent_memory.tool_actions import tool_action
from agent_memory.wrappers.recorder import EpisodeRecorder

__all__ = ["Plan", "StepFlow", "Verdicts", "nones"]


def nones(n: int) -> np.ndarray:
    """A 1-D object array of ``n`` Nones (numpy fills an empty object array with None); its
    entries are then set one by one: ``np.array`` would turn equal-length lists into 2-D."""
    return np.empty(n, dtype=object)


@dataclass
class Plan:
    """What the acting envs' responses turned into, before the env steps.

    Attributes:
        ids: the envs that act.
        responses, env_actions: env id -> the model's response; the action its env gets.
        parsed: env id -> the parsed response (with a parser; not for memory actions).
        replies: env id -> the memory's reply to a memory action.
    """

    ids: list[int]
    responses: dict[int, Any]
    env_actions: dict[int, Any]
    parsed: dict[int, ParsedAction] = field(default_factory=dict)
    replies: dict[int, str] = field(default_factory=dict)


@dataclass
class Verdicts:
    """Per env (arrays over all envs; envs that did not act are valid, with no penalty): the
    step's validity as the wrappers report it in ``info``."""

    is_action_valid: np.ndarray
    invalid_reason: np.ndarray
    parsed_action: np.ndarray
    thought: np.ndarray
    invalid_penalty: np.ndarray
    replies: dict[int, str]
    #: env id -> the memory's flag for the step stored (``BaseMemory.step_flags``).
    flags: dict[int, str] = field(default_factory=dict)
    #: env id -> its note's tokens after the step was stored (``BaseMemory.note_lengths``).
    note_tokens: dict[int, int] = field(default_factory=dict)

    def items(self) -> list[tuple[str, np.ndarray]]:
        """The info keys and their per-env values (``memory_reply`` apart)."""
        return [
            (IS_ACTION_VALID, self.is_action_valid),
            (INVALID_REASON, self.invalid_reason),
            ("parsed_action", self.parsed_action),
            ("thought", self.thought),
            ("invalid_penalty", self.invalid_penalty),
        ]

    def info_at(self, i: int) -> dict[str, Any]:
        """Env ``i``'s values as a single env's info (plain Python scalars)."""
        out = {
            key: values[i].item() if values.dtype != object else values[i]
            for key, values in self.items()
        }
        if i in self.replies:
            out["memory_reply"] = self.replies[i]
        if i in self.flags:
            out["memory_flag"] = self.flags[i]
        if i in self.note_tokens:
            out["memory_note_tokens"] = self.note_tokens[i]
        return out


class StepFlow:
    """Steps 1-6 of the module docstring, for any acting envs.

    Args:
        recorder: stores the steps and keeps the returns.
        parser: turns responses into env actions (None: responses go to the env as is, and
            no verdict is made).
    """

    def __init__(self, recorder: EpisodeRecorder, parser: ActionParser | None) -> None:
        self.recorder = recorder
        self.parser = parser
        self.num_envs = recorder.num_envs
        # A memory without memory actions needs no scan of the responses (nor, without flags
        # or a note, a question after each store).
        kind = type(recorder.memory)
        self._intercepts = kind.intercept is not BaseMemory.intercept
        self._flags = kind.step_flags is not BaseMemory.step_flags
        self._notes = kind.note_lengths is not BaseMemory.note_lengths

    def plan(self, responses: Sequence[Any], ids: Sequence[int]) -> Plan:
        """Intercept, parse and fall back for the envs in ``ids`` (``responses`` indexed by env)."""
        ids = list(ids)
        given = {i: responses[i] for i in ids}
        parser = self.parser
        if parser is None:
            return Plan(ids, given, dict(given))
        replies = self._intercept(given)
        fallback = parser.fallback_action()
        todo = [i for i in ids if i not in replies] if replies else ids
        texts, admissible = [given[i] for i in todo], self.recorder.state.admissibles_of(todo)
        if parser.tool_calls:
            parsed = dict(zip(todo, self._tool_actions(todo, texts, admissible), strict=True))
        else:
            parsed = dict(zip(todo, map(parser.parse, texts, admissible), strict=True))
        actions = dict.fromkeys(ids, fallback)  # memory actions and invalid responses
        actions.update((i, p.action) for i, p in parsed.items() if p.valid)
        if parser.on_invalid == "raw":  # an invalid response's own text
            actions.update(
                (i, parser.invalid_action(given[i])) for i, p in parsed.items() if not p.valid
            )
        return Plan(ids, given, actions, parsed, replies)

    def _tool_actions(
        self, ids: list[int], texts: list[Any], admissible: list[list[Any] | None]
    ) -> list[ParsedAction]:
        """The actions the responses' tool calls make (the parser reads tool calls)."""
        assert self.parser is not None
        state, parser = self.recorder.state, self.parser
        memory_tools = frozenset(getattr(self.recorder.memory, "tool_names", frozenset()))
        return [
            tool_action(parser, text, a, tools, memory_tools=memory_tools, parallel=parallel)
            for text, a, tools, parallel in zip(
                texts, admissible, state.tools_of(ids), state.parallel_of(ids), strict=True
            )
        ]

    def record(
        self,
        plan: Plan,
        step_infos: Mapping[int, Mapping[str, Any]],
        rewards: np.ndarray,
        extras: Mapping[str, Sequence[Any]] | None = None,
    ) -> Verdicts | None:
        """Store the step of each acting env, judge it (``step_infos``: env id -> its step's
        info) and add the penalty to ``rewards`` in place; the verdicts (None without a parser)."""
        ids, parser, recorder, responses = plan.ids, self.parser, self.recorder, plan.responses
        if parser is None:
            recorder.store(ids, [responses[i] for i in ids], None, extras, responses)
            recorder.add_rewards(ids, rewards[ids])
            return None
        parsed = plan.parsed
        # A memory action (not parsed) is stored as written (lone surrogates replaced).
        texts = [parsed[i].text if i in parsed else utf8_safe(responses[i]) for i in ids]
        thoughts = [parsed[i].thought if i in parsed else "" for i in ids]
        recorder.store(ids, texts, thoughts if parser.think_tag else None, extras, responses)
        verdicts = self._judge(plan, step_infos, parser.invalid_penalty)
        if self._flags:
            verdicts.flags = recorder.memory.step_flags(ids)
        if self._notes:
            verdicts.note_tokens = recorder.memory.note_lengths(ids)
        rewards += verdicts.invalid_penalty
        recorder.add_rewards(ids, rewards[ids])
        return verdicts

    def _intercept(self, given: Mapping[int, Any]) -> dict[int, str]:
        """Memory actions among the responses: env id -> the memory's reply (only a str within
        the parser's ``max_chars`` reaches the memory; the parser rejects the others)."""
        if not self._intercepts:
            return {}
        assert self.parser is not None
        cap, memory = self.parser.max_chars, self.recorder.memory
        replies = {}
        for i, r in given.items():
            if not isinstance(r, str) or len(r) > cap:
                continue
            reply = memory.intercept(i, utf8_safe(r))
            if reply is not None:
                replies[i] = reply
        return replies

    def _judge(
        self, plan: Plan, step_infos: Mapping[int, Mapping[str, Any]], invalid_penalty: float
    ) -> Verdicts:
        # Arrays over every env, filled for the acting ones only (one pass over them).
        n = self.num_envs
        valid = np.ones(n, dtype=bool)
        reasons, actions, thoughts = nones(n), nones(n), nones(n)
        for i, p in plan.parsed.items():  # a memory action: valid, no env action, no penalty
            # The parser's verdict, then the env's own (``is_action_valid``).
            if not p.valid:
                valid[i], reasons[i] = False, p.reason
            elif not step_infos[i].get(IS_ACTION_VALID, True):
                reason = step_infos[i].get(INVALID_REASON, "the env rejected the action")
                valid[i], reasons[i] = False, reason
            actions[i] = p.action
            thoughts[i] = p.thought
        return Verdicts(
            is_action_valid=valid,
            invalid_reason=reasons,
            parsed_action=actions,
            thought=thoughts,
            invalid_penalty=np.where(valid, 0.0, invalid_penalty),
            replies=plan.replies,
        )

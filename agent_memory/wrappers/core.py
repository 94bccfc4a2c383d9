"""Per-env history bookkeeping shared by :class:`VectorHistoryWrapper` and :class:`HistoryWrapper`.

:class:`HistoryCore` owns the memory and, per env, the text of the observation the next action
will be taken on, the task and the admissible actions. The wrappers decide *when* an episode
starts, advances or ends (that is where the autoreset modes differ); the core does the rest:
parsing responses, storing steps, handing finished episodes over, and rendering prompts with
their figures (history steps, characters, tokens).
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory, HistoryMemory
from agent_memory.memory.base import check_history_length
from agent_memory.parsing import ActionParser, ParsedAction
from agent_memory.prompts import PromptTemplate
from agent_memory.text import utf8_safe
from agent_memory.tokens import TokenCounterSpec, make_token_counter

__all__ = ["HistoryCore", "OwnsHistory", "PromptText", "object_array"]

Prompt = str | list[dict[str, str]]


class PromptText(spaces.Text):
    """A ``Text`` space holding any string up to ``max_length`` (prompts carry whatever text the
    env and the model produced, so no fixed charset can bound them). Samples use printable ASCII.
    """

    def __init__(self, max_length: int = 10**7) -> None:
        super().__init__(max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"PromptText(max_length={self.max_length})"


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array (``np.array`` would turn equal-length lists into a 2-D array)."""
    arr = np.empty(len(values), dtype=object)
    for j, v in enumerate(values):
        arr[j] = v
    return arr


def _to_text(obs: Any) -> str:
    return obs if isinstance(obs, str) else str(obs)


class _SafeText:
    """An ``obs_to_text`` whose str results encode as UTF-8 (lone surrogates replaced): they go
    into the history, the prompts (HTTP bodies) and saved sessions."""

    def __init__(self, fn: Callable[[Any], str]) -> None:
        self.fn = fn

    def __call__(self, obs: Any) -> str:
        text = self.fn(obs)
        return utf8_safe(text) if isinstance(text, str) else text


class HistoryCore:
    """The history, prompts and parsing of ``num_envs`` envs (see the module docstring).

    Args: see :class:`~agent_memory.wrappers.VectorHistoryWrapper`.
    """

    def __init__(
        self,
        num_envs: int,
        *,
        history_length: int = 3,
        memory: BaseMemory | None = None,
        formatter: FormatterSpec = "simple",
        template: PromptTemplate | Mapping[str, Any] | str | None = None,
        parser: ActionParser | None = None,
        token_counter: TokenCounterSpec = "estimate",
        max_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
        bounded: bool = False,
        obs_to_text: Callable[[Any], str] | None = None,
    ) -> None:
        self.num_envs = num_envs
        self.history_length = check_history_length(history_length)
        self.counter = make_token_counter(token_counter)
        if memory is None:
            capacity = None
            if bounded:
                if self.history_length == -1:
                    raise ValueError(
                        "bounded=True keeps only history_length steps per env, but "
                        "history_length=-1 asks for whole episodes: set bounded=False"
                    )
                capacity = max(1, self.history_length)
            memory = HistoryMemory(
                num_envs, formatter, max_tokens=max_tokens, token_counter=self.counter,
                capacity=capacity,
            )  # fmt: skip
        elif len(memory) != num_envs:
            raise ValueError(
                f"memory holds {len(memory)} envs, expected {num_envs} (one per sub-env)"
            )
        self.memory = memory
        self.chat = memory.output == "messages"
        self.template = PromptTemplate.from_config(template)
        self.parser = parser
        if max_prompt_tokens is not None and (
            not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1
        ):
            raise ValueError(
                f"max_prompt_tokens must be None or an int >= 1, got {max_prompt_tokens!r}"
            )
        self.max_prompt_tokens = max_prompt_tokens
        self.obs_to_text = _SafeText(obs_to_text or _to_text)
        self.last_obs: list[str] = [""] * num_envs
        self.tasks: list[str | None] = [None] * num_envs
        self.admissible: list[list[Any] | None] = [None] * num_envs
        self.handed_over = np.zeros(num_envs, dtype=bool)
        self.returns = np.zeros(num_envs, dtype=np.float64)
        #: Tokens of the smallest prompt the template makes: an empty observation, no history,
        #: no admissible actions, only the template's own task (env 0 is still blank here).
        self.frame_tokens = self.counter(_prompt_text(self._render(0, None, 0, 0)))
        if max_prompt_tokens is not None and max_prompt_tokens < self.frame_tokens:
            raise ValueError(
                f"max_prompt_tokens={max_prompt_tokens} is below the prompt's frame: the template "
                f"alone (empty observation, no history) takes {self.frame_tokens} tokens "
                f"({self.counter.name}), so every prompt would exceed the budget: expected "
                f"max_prompt_tokens >= {self.frame_tokens} plus room for observations and "
                "history, or None (no budget)"
            )

    # ------------------------------------------------------------------ episodes

    def start(self, ids: Sequence[int], obs_texts: Sequence[str], infos: Sequence[Mapping]) -> None:
        """Begin new episodes in ``ids`` from their first observations and reset infos."""
        ids = list(ids)
        self.memory.reset(ids)
        for i, text, info in zip(ids, obs_texts, infos, strict=True):
            self.last_obs[i] = text
            task = info.get("task")
            self.tasks[i] = utf8_safe(task) if isinstance(task, str) else task
            self.admissible[i] = _listify(info.get("admissible_actions"))
            self.handed_over[i] = False
            self.returns[i] = 0.0
        if ids:
            self.memory.start_episodes(ids, [self.task_of(i) for i in ids], list(obs_texts))

    def task_of(self, i: int) -> str | None:
        """Env ``i``'s task: the template's when set, else the env's ``info["task"]``."""
        return self.template.task or self.tasks[i]

    def observe(
        self, ids: Sequence[int], obs_texts: Sequence[str], infos: Sequence[Mapping]
    ) -> None:
        """The envs in ``ids`` moved on within their episodes."""
        for i, text, info in zip(ids, obs_texts, infos, strict=True):
            self.last_obs[i] = text
            if "admissible_actions" in info:
                self.admissible[i] = _listify(info["admissible_actions"])

    def parse(self, responses: Sequence[Any], ids: Sequence[int]) -> dict[int, ParsedAction]:
        """Parse the responses of ``ids`` (indexed by env id) against each env's admissible set."""
        assert self.parser is not None
        return {i: self.parser.parse(responses[i], self.admissible[i]) for i in ids}

    def store(
        self,
        ids: Sequence[int],
        action_texts: Sequence[Any],
        thoughts: Sequence[str] | None,
        extras: Mapping[str, Sequence[Any]] | None,
    ) -> None:
        """Store one step for each env in ``ids``: the observation it acted on and its action."""
        if not ids:
            return
        record: dict[str, Sequence[Any]] = {
            "observation": [self.last_obs[i] for i in ids],
            "action": list(action_texts),
        }
        if thoughts is not None:
            record["thought"] = list(thoughts)
        if extras:
            for key, values in extras.items():
                if key in record:
                    raise ValueError(
                        f"extras key {key!r} clashes with a key the wrapper stores "
                        f"({sorted(record)}); rename it"
                    )
                record[key] = [values[i] for i in ids]
        self.memory.store(record, env_ids=list(ids))

    def handover(
        self, ids: Sequence[int], final_texts: Sequence[str], terminated: Sequence[bool],
        truncated: Sequence[bool], won: Sequence[bool] | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """The episodes of ``ids`` as dicts, given to the memory's ``end_episodes`` hook before
        their history is cleared."""
        out = []
        won = [False] * len(ids) if won is None else won
        rows = zip(ids, final_texts, terminated, truncated, won, strict=True)
        for i, final, term, trunc, w in rows:
            records = self.memory[i]
            n = self.memory.num_steps(i)
            out.append(
                {
                    "records": records,
                    "final_observation": final,
                    "num_steps": n,
                    "first_step": n - len(records) + 1,
                    "terminated": bool(term),
                    "truncated": bool(trunc),
                    "task": self.task_of(i),
                    "return": float(self.returns[i]),
                    "won": bool(w),
                }
            )
            self.handed_over[i] = True
        if out:
            self.memory.end_episodes(list(ids), out)
        return out

    @staticmethod
    def verdict(parsed: ParsedAction, env_info: Mapping[str, Any]) -> tuple[bool, str | None]:
        """A step's validity and reason: the parser's, then the env's own (``is_action_valid``)."""
        if not parsed.valid:
            return False, parsed.reason
        if bool(env_info.get("is_action_valid", True)):
            return True, None
        return False, env_info.get("invalid_reason", "the env rejected the action")

    def intercept(self, responses: Sequence[Any], ids: Sequence[int]) -> dict[int, str]:
        """Memory actions among the responses of ``ids``: env id -> the memory's reply.

        Only a str within the parser's ``max_chars`` reaches the memory (lone surrogates
        replaced, as the parser does): any other response goes to the parser, which rejects
        it, before any memory scans it.
        """
        if type(self.memory).intercept is BaseMemory.intercept:  # no memory actions
            return {}
        cap = None if self.parser is None else self.parser.max_chars
        replies = {}
        for i in ids:
            r = responses[i]
            if not isinstance(r, str) or (cap is not None and len(r) > cap):
                continue
            reply = self.memory.intercept(i, utf8_safe(r))
            if reply is not None:
                replies[i] = reply
        return replies

    @staticmethod
    def memory_action_text(response: str) -> str:
        """What the history stores for a response the memory answered (:meth:`intercept`)."""
        return utf8_safe(response)

    # ------------------------------------------------------------------ sessions

    def state_dict(self) -> dict[str, Any]:
        """The memory's state plus what the prompts are built from (JSON-able when the
        memory's records are)."""
        return {
            "version": 1,
            "num_envs": self.num_envs,
            "memory": self.memory.state_dict(),
            "last_obs": list(self.last_obs),
            "tasks": list(self.tasks),
            "admissible": [None if a is None else list(a) for a in self.admissible],
            "handed_over": self.handed_over.tolist(),
            "returns": self.returns.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next prompts equal those of the saved session."""
        if state.get("version") != 1 or state.get("num_envs") != self.num_envs:
            raise ValueError(
                f"cannot load session: expected version 1 with num_envs={self.num_envs}, got "
                f"version {state.get('version')!r} with num_envs={state.get('num_envs')!r}"
            )
        self.memory.load_state_dict(state["memory"])
        self.last_obs = list(state["last_obs"])
        self.tasks = list(state["tasks"])
        self.admissible = [None if a is None else list(a) for a in state["admissible"]]
        self.handed_over = np.array(state["handed_over"], dtype=bool)
        self.returns = np.array(state["returns"], dtype=np.float64)

    def save_session(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`state_dict` as UTF-8 JSON, atomically: the whole text is made first, then
        written to a temp file beside ``path``, synced and renamed into place; on any failure
        the temp file is removed and an existing file at ``path`` is left as it was.

        Text that UTF-8 cannot hold (a lone surrogate in a record or an extra) is written as
        JSON ``\\u`` escapes, which :meth:`load_session` reads back exactly.

        Raises:
            TypeError: the state holds a value JSON cannot hold (e.g. bytes or an object in
                ``extras``); nothing is written.
        """
        path = Path(path)
        state = self.state_dict()
        try:
            try:
                data = json.dumps(state, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                data = json.dumps(state, ensure_ascii=True).encode("ascii")
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"cannot save the session to {str(path)!r}: its state is not JSON-serialisable "
                f"({e}); store only str, int, float, bool, None, lists and dicts in records and "
                "extras (e.g. extras={'logprob': [float(x) for x in logprobs]})"
            ) from e
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def load_session(self, path: str | os.PathLike[str]) -> None:
        """Restore a session written by :meth:`save_session`."""
        self.load_state_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    # ------------------------------------------------------------------ prompts

    def prompts(self) -> tuple[list[Prompt], dict[str, np.ndarray]]:
        """Every env's prompt, and per-env figures: history steps, context chars and tokens."""
        n = self.num_envs
        hl = self.history_length
        steps = [self.memory.num_steps(i) for i in range(n)]
        # Memories with something to show before the first step (shared notes, past episodes)
        # are fetched for every env.
        always = self.memory.fetch_when_empty
        use_history = [always or (hl != 0 and s > 0) for s in steps]
        budgets = self._history_budgets(steps) if self.max_prompt_tokens is not None else None
        hist_ids = [i for i in range(n) if use_history[i]]
        contexts: dict[int, Any] = {}
        lengths: dict[int, int] = {}
        if hist_ids:
            kwargs: dict[str, Any] = {}
            if budgets is not None:
                kwargs["max_tokens"] = [budgets[i] for i in hist_ids]
            if self.memory.accepts_queries:  # retrieval: relevance to the current observation
                kwargs["queries"] = [self.last_obs[i] for i in hist_ids]
            fetched = self.memory.fetch(hl, env_ids=hist_ids, **kwargs)
            contexts = dict(zip(hist_ids, fetched.contexts, strict=True))
            lengths = dict(zip(hist_ids, fetched.lengths, strict=True))
        prompts = [self._render(i, contexts.get(i), lengths.get(i, 0), steps[i]) for i in range(n)]
        chars, tokens = self._measure(prompts)
        if self.max_prompt_tokens is not None:
            # Tokenizers are not exactly additive over the joins: drop the oldest history steps
            # of the rare prompt that still ends up over budget.
            for i in range(n):
                while tokens[i] > self.max_prompt_tokens and lengths.get(i, 0) > 0:
                    lengths[i] -= 1
                    kwargs = {"queries": [self.last_obs[i]]} if self.memory.accepts_queries else {}
                    ctx = self.memory.fetch(
                        lengths[i], env_ids=[i], max_tokens=None, **kwargs
                    ).contexts[0]
                    prompts[i] = self._render(i, ctx if lengths[i] else None, lengths[i], steps[i])
                    (chars[i],), (tokens[i],) = self._measure([prompts[i]])
        figures = {
            "history_steps": np.array([lengths.get(i, 0) for i in range(n)], dtype=np.int64),
            "context_chars": np.array(chars, dtype=np.int64),
            "context_tokens": np.array(tokens, dtype=np.int64),
            "episode_step": np.array(steps, dtype=np.int64),
        }
        return prompts, figures

    def _render(self, i: int, context: Any, length: int, step_count: int) -> Prompt:
        t = self.template
        task = self.task_of(i)  # a configured task wins over the env's generic one
        if self.chat:
            user = t.render(
                observation=self.last_obs[i], task=task, admissible=self.admissible[i],
                step_count=step_count,
            )  # fmt: skip
            system = t.render_system(task=task)
            head = [] if system is None else [{"role": "system", "content": system}]
            return [*head, *(context or []), {"role": "user", "content": user}]
        prompt = t.render(
            observation=self.last_obs[i], task=task, admissible=self.admissible[i],
            history=context if length > 0 else None, history_length=length, step_count=step_count,
        )  # fmt: skip
        if length == 0 and context:  # no steps yet, but the memory has notes: put them first
            prompt = f"{context}\n\n{prompt}"
        return prompt

    def _measure(self, prompts: Sequence[Prompt]) -> tuple[list[int], list[int]]:
        """Characters and tokens of each prompt's text. A counter that needs only the length
        (the default estimate) gets it without the text being built: no copy of a long prompt."""
        count_length = getattr(self.counter, "count_length", None)
        if count_length is not None:
            chars = [_prompt_len(p) for p in prompts]
            return chars, [count_length(c) for c in chars]
        texts = [_prompt_text(p) for p in prompts]
        return [len(t) for t in texts], self.counter.count_many(texts)

    def _history_budgets(self, steps: Sequence[int]) -> list[int | None]:
        """Tokens left for history in each env's prompt under ``max_prompt_tokens``."""
        assert self.max_prompt_tokens is not None
        frames = [
            _prompt_text(self._render(i, [] if self.chat else "", 1, steps[i]))
            for i in range(self.num_envs)
        ]
        default = self.memory.max_tokens
        out: list[int | None] = []
        for used in self.counter.count_many(frames):
            left = max(0, self.max_prompt_tokens - used)
            out.append(left if default is None else min(left, default))
        return out


def _listify(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    return list(value)


def _prompt_text(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return "".join(m["content"] + "\n" for m in prompt)


def _prompt_len(prompt: Prompt) -> int:
    """``len(_prompt_text(prompt))``."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m["content"]) + 1 for m in prompt)


class OwnsHistory:
    """What both wrappers expose of their :class:`HistoryCore` (kept in one place)."""

    _core: HistoryCore

    @property
    def memory(self) -> BaseMemory:
        """The memory holding every env's history."""
        return self._core.memory

    @property
    def parser(self) -> ActionParser | None:
        """The response parser (None: actions pass through unparsed)."""
        return self._core.parser

    @property
    def history_length(self) -> int:
        """Steps of history in each prompt (0 none, -1 whole episode)."""
        return self._core.history_length

    def save_session(self, path: str | os.PathLike[str]) -> Path:
        """Save the whole memory (every env's history) and the current prompts' inputs as JSON;
        :meth:`load_session` restores them into a wrapper built with the same settings."""
        return self._core.save_session(path)

    def load_session(self, path: str | os.PathLike[str]) -> None:
        """Restore a session saved by :meth:`save_session`."""
        self._core.load_session(path)

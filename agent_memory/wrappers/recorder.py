"""``EpisodeRecorder``: each env's running episode, from its start to its hand-over.

The recorder owns the memory and the :class:`~agent_memory.wrappers.state.EpisodeState` and
keeps them in step; the wrappers tell it *when* an episode starts, stores a step or ends. Steps
store ``shown`` (what the policy was shown) and ``response`` (what the model wrote) only when the
memory's formatter reads those record keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from agent_memory.memory import HistoryMemory
from agent_memory.protocol import Episode
from agent_memory.text import utf8_safe
from agent_memory.wrappers.options import HistoryOptions
from agent_memory.wrappers.state import EnvView, EpisodeState, env_ids_arg

__all__ = ["TRANSCRIPT_KEYS", "EpisodeRecorder", "response_text"]

#: The record keys a formatter may read to get what the policy saw and wrote.
TRANSCRIPT_KEYS: Final = frozenset({"shown", "response"})
#: Cap of a stored response without a parser (the parser's default ``max_chars``).
_DEFAULT_CAP: Final = 20_000


def response_text(response: Any, cap: int) -> str:
    """A response as stored text: a str as written, anything else as its ``repr``; at most
    ``cap`` characters, lone surrogates replaced.

    Example:
        >>> response_text("<action>up</action>", 10), response_text(b"up", 100)
        ('<action>up', "b'up'")
    """
    text = response if isinstance(response, str) else repr(response)
    return utf8_safe(text[:cap])


def _safe_text(fn: Callable[[Any], str] | None) -> Callable[[Any], str]:
    """An ``obs_to_text`` (None: ``str``) whose str results encode as UTF-8 (lone surrogates
    replaced): they go into the history, the prompts (HTTP bodies) and saved sessions."""
    if fn is None:
        return _to_text

    def safe(obs: Any) -> str:
        text = fn(obs)
        return utf8_safe(text) if isinstance(text, str) else text

    return safe


def _to_text(obs: Any) -> str:
    """The default ``obs_to_text``: ``str``, UTF-8 safe (one call per observation)."""
    text = obs if isinstance(obs, str) else str(obs)
    return text if text.isascii() else utf8_safe(text)


class EpisodeRecorder:
    """The running episodes of ``num_envs`` envs (see the module docstring).

    Args:
        options: the wrapper's settings (the memory is built from them when none is given).

    Attributes:
        memory, state: every env's steps; the per-env state (only the recorder writes it).
        obs_to_text: turns an inner observation into the text stored and shown.
        transcript_keys: which of ``shown`` / ``response`` the steps store.
    """

    def __init__(self, num_envs: int, options: HistoryOptions) -> None:
        memory = options.memory
        if memory is None:
            memory = HistoryMemory(
                num_envs,
                options.formatter,
                max_history_tokens=options.max_history_tokens,
                token_counter=options.counter,
                capacity=options.capacity,
            )
        elif len(memory) != num_envs:
            raise ValueError(
                f"memory holds {len(memory)} envs, expected {num_envs} (one per sub-env)"
            )
        self.num_envs = num_envs
        self.memory = memory
        self.state = EpisodeState(num_envs, options.prompt_template.task)
        self.obs_to_text = _safe_text(options.obs_to_text)
        self.transcript_keys = memory.record_keys & TRANSCRIPT_KEYS
        self._cap = _DEFAULT_CAP if options.parser is None else options.parser.max_chars

    def start(self, ids: Sequence[int], texts: Sequence[str], infos: Sequence[Mapping]) -> None:
        """Begin new episodes in ``ids`` from their first observations and reset infos."""
        ids = list(ids)
        self.memory.reset(ids)
        self.state.start(ids, texts, infos)
        if ids:
            self.memory.start_episodes(ids, [self.state.task(i) for i in ids], list(texts))

    def observe(self, ids: Sequence[int], texts: Sequence[str], infos: Sequence[Mapping]) -> None:
        """The envs in ``ids`` moved on within their episodes (``infos`` may update their
        admissible actions)."""
        self.state.observe(ids, texts, infos)

    def store(
        self,
        ids: Sequence[int],
        actions: Sequence[Any],
        thoughts: Sequence[str] | None,
        extras: Mapping[str, Sequence[Any]] | None,
        responses: Mapping[int, Any],
    ) -> None:
        """Store one step for each env in ``ids``: the observation it acted on, its action, its
        thought, the ``extras`` (indexed by env id) and the transcript keys (``responses``: the
        model's response by env id)."""
        if not ids:
            return
        state = self.state
        record: dict[str, Sequence[Any]] = {
            "observation": state.observations_of(ids),
            "action": list(actions),
        }
        if thoughts is not None:
            record["thought"] = list(thoughts)
        if "shown" in self.transcript_keys:
            record["shown"] = [state.shown(i) for i in ids]
        if "response" in self.transcript_keys:
            record["response"] = [response_text(responses[i], self._cap) for i in ids]
        if extras:
            for key, values in extras.items():
                if key in record:
                    raise ValueError(
                        f"extras key {key!r} clashes with a key the wrapper stores "
                        f"({sorted(record)}); rename it"
                    )
                record[key] = [values[i] for i in ids]
        self.memory.store(record, env_ids=env_ids_arg(ids, self.num_envs))

    def add_rewards(self, ids: Sequence[int], rewards: Sequence[float] | np.ndarray) -> None:
        """Add the step rewards of ``ids`` to their returns."""
        self.state.add_rewards(ids, rewards)

    def showed(self, ids: Sequence[int], shown: Callable[[int], str]) -> None:
        """The policies of ``ids`` were just shown new prompts (``shown(j)``: the text of the
        ``j``-th); kept only when the steps store ``shown``."""
        if "shown" in self.transcript_keys:
            self.state.show(ids, [shown(j) for j in range(len(ids))])

    def handover(
        self,
        ids: Sequence[int],
        finals: Sequence[str],
        terminated: Sequence[bool] | np.ndarray,
        truncated: Sequence[bool] | np.ndarray,
        won: Sequence[bool] | None = None,
    ) -> list[Episode]:
        """The episodes of ``ids`` as :class:`~agent_memory.protocol.Episode` dicts, given to
        the memory's ``end_episodes`` hook before their history is cleared."""
        out: list[Episode] = []
        won = [False] * len(ids) if won is None else won
        memory, state = self.memory, self.state
        for i, final, term, trunc, w in zip(ids, finals, terminated, truncated, won, strict=True):
            records = memory[i]
            n = memory.num_steps(i)
            episode: Episode = {
                "records": records,
                "final_observation": final,
                "num_steps": n,
                "first_step": n - len(records) + 1,
                "terminated": bool(term),
                "truncated": bool(trunc),
                "task": state.task(i),
                "return": state.episode_return(i),
                "won": bool(w),
            }
            out.append(episode)
        state.mark_handed_over(ids)
        if out:
            memory.end_episodes(list(ids), out)
        return out

    def abandon(self, ids: Sequence[int]) -> tuple[list[int], list[Episode]]:
        """Hand over the unfinished episodes of ``ids`` that a reset discards (those with steps
        not yet handed over): their ids and episodes (neither terminated nor truncated)."""
        state, memory = self.state, self.memory
        gone = [i for i in ids if not state.handed_over(i) and memory.num_steps(i) > 0]
        finals = [state.observation(i) for i in gone]
        return gone, self.handover(gone, finals, [False] * len(gone), [False] * len(gone))

    def view(self, i: int) -> EnvView:
        """Env ``i``'s current observation, task, admissible actions, step and return."""
        state = self.state
        admissible = state.admissible(i)
        tools = state.tools_of([i])[0]
        return EnvView(
            observation=state.observation(i),
            task=state.task(i),
            admissible_actions=None if admissible is None else tuple(admissible),
            episode_step=self.memory.num_steps(i),
            episode_return=state.episode_return(i),
            tools=None if tools is None else tuple(tools),
        )

    def state_dict(self) -> dict[str, Any]:
        """The memory's state plus what the prompts are built from (JSON-able when the
        memory's records are)."""
        return {
            "version": 1,
            "num_envs": self.num_envs,
            "memory": self.memory.state_dict(),
            **self.state.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: the next prompts equal those of the saved session."""
        if state.get("version") != 1 or state.get("num_envs") != self.num_envs:
            raise ValueError(
                f"cannot load session: expected version 1 with num_envs={self.num_envs}, got "
                f"version {state.get('version')!r} with num_envs={state.get('num_envs')!r}"
            )
        self.memory.load_state_dict(state["memory"])
        self.state.load_state_dict(state)

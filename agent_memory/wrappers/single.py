"""``HistoryWrapper``: the single-env counterpart of :class:`VectorHistoryWrapper`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym

from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.tokens import TokenCounterSpec
from agent_memory.wrappers.core import HistoryCore, OwnsHistory, PromptText

__all__ = ["HistoryWrapper"]


class HistoryWrapper(OwnsHistory, gym.Wrapper):
    """Owns the interaction history of one ``gymnasium.Env`` and returns prompts as observations.

    Same behaviour and arguments as :class:`~agent_memory.wrappers.VectorHistoryWrapper` for
    one env (``n`` single envs wrapped in ``HistoryWrapper`` give the same prompts as one
    ``VectorHistoryWrapper`` over ``make_vec(id, n)``). ``info`` values are scalars; the finished
    episode is handed over in ``info["episode_history"]`` on its last step, and ``reset`` hands
    over an unfinished one it discards.

    Example:
        >>> import gymnasium as gym
        >>> import envs  # registers the bundled text envs
        >>> from agent_memory.parsing import ActionParser
        >>> from agent_memory.wrappers import HistoryWrapper
        >>> env = HistoryWrapper(gym.make("agent_memory/Recall-v0", num_distractors=1),
        ...                      history_length=-1, parser=ActionParser())
        >>> prompt, info = env.reset(seed=0)
        >>> prompt, reward, terminated, truncated, info = env.step("<action>next</action>")
        >>> info["history_steps"], info["is_action_valid"]
        (1, True)
        >>> "[Observation 1: 'Remember this: the balloon is BROWN." in prompt
        True
    """

    def __init__(
        self,
        env: gym.Env,
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
        super().__init__(env)
        self._core = HistoryCore(
            1, history_length=history_length, memory=memory, formatter=formatter,
            template=template, parser=parser, token_counter=token_counter,
            max_tokens=max_tokens, max_prompt_tokens=max_prompt_tokens, bounded=bounded,
            obs_to_text=obs_to_text,
        )  # fmt: skip
        self.observation_space = PromptText()
        if parser is not None:
            self.action_space = PromptText()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        core = self._core
        handed = None
        if not core.handed_over[0] and self.memory.num_steps(0) > 0:
            handed = core.handover([0], [core.last_obs[0]], [False], [False])[0]
        obs, info = self.env.reset(seed=seed, options=options)
        core.start([0], [core.obs_to_text(obs)], [info])
        return self._finish(info, handed)

    def step(
        self, action: Any, extras: Mapping[str, Any] | None = None
    ) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step with the model's response (or an env action, without a parser).

        Args:
            action: the response.
            extras: more values to store with this step (e.g. ``{"logprob": -0.3}``).
        """
        core = self._core
        parser = core.parser
        parsed = None
        reply = None
        env_action = action
        if parser is not None:
            reply = core.intercept([action], [0]).get(0)
            if reply is None:
                parsed = core.parse([action], [0])[0]
                env_action = parsed.action if parsed.valid else parser.fallback_action()
            else:  # a memory action (<record>, <retrieve>): the env gets a no-op
                env_action = parser.fallback_action()
        obs, reward, terminated, truncated, info = self.env.step(env_action)
        info = dict(info)
        reward = float(reward)
        boxed = None if extras is None else {k: [v] for k, v in extras.items()}
        if parsed is not None:
            core.store([0], [parsed.text], [parsed.thought] if parser.think_tag else None, boxed)
            valid, reason = core.verdict(parsed, info)
            penalty = 0.0 if valid else parser.invalid_penalty
            reward += penalty
            info.update(
                is_action_valid=valid,
                invalid_reason=reason,
                parsed_action=parsed.action,
                thought=parsed.thought,
                invalid_penalty=penalty,
            )
        elif reply is not None:
            text = core.memory_action_text(action)
            core.store([0], [text], [""] if parser.think_tag else None, boxed)
            info.update(
                is_action_valid=True, invalid_reason=None, parsed_action=None, thought="",
                invalid_penalty=0.0, memory_reply=reply,
            )  # fmt: skip
        else:
            core.store([0], [action], None, boxed)
        core.returns[0] += reward
        text = core.obs_to_text(obs)
        handed = None
        if terminated or truncated:
            won = bool(info.get("won", False))
            handed = core.handover([0], [text], [terminated], [truncated], [won])[0]
            core.observe([0], [text], [{}])
        else:
            core.observe([0], [text], [info])
        prompt, info = self._finish(info, handed)
        return prompt, reward, terminated, truncated, info

    def close(self) -> None:
        """Close the memory (files, connections), then the env."""
        self._core.memory.close()
        super().close()

    def _finish(self, info: dict[str, Any], handed: dict[str, Any] | None) -> tuple[Any, dict]:
        prompts, figures = self._core.prompts()
        info = dict(info)
        info["raw_obs"] = self._core.last_obs[0]
        info.update({key: value[0].item() for key, value in figures.items()})
        if handed is not None:
            info["episode_history"] = handed
        return prompts[0], info

"""``HistoryWrapper``: the single-env counterpart of :class:`VectorHistoryWrapper`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Never, SupportsFloat

import gymnasium as gym
import numpy as np

from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.protocol import EPISODE_HISTORY, WON, Episode
from agent_memory.tokens import TokenCounterSpec
from agent_memory.wrappers.base import FIGURES, OwnsHistory
from agent_memory.wrappers.options import TemplateSpec
from agent_memory.wrappers.prompt import PromptText

__all__ = ["HistoryWrapper"]


class HistoryWrapper(OwnsHistory, gym.Wrapper):
    """Owns the interaction history of one ``gymnasium.Env`` and returns prompts as observations.

    The step flow of :class:`~agent_memory.wrappers.VectorHistoryWrapper` over one env (the same
    prompts); ``info`` values are scalars. The settings are keywords, as for the vector
    wrapper (documented and checked in :class:`~agent_memory.wrappers.HistoryOptions`).

    Example:
        >>> import gymnasium as gym
        >>> import agent_memory.envs  # registers the bundled text envs
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
        template: TemplateSpec = None,
        parser: ActionParser | None = None,
        token_counter: TokenCounterSpec = "estimate",
        max_history_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
        bounded: bool = False,
        obs_to_text: Callable[[Any], str] | None = None,
        **unknown: Never,  # none is accepted: caught to name the setting meant
    ) -> None:
        super().__init__(env)
        self._setup(1, locals(), unknown)
        self.observation_space = PromptText()
        if self.parser is not None:
            self.action_space = PromptText()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        recorder = self._parts.recorder
        _, handed = recorder.abandon([0])
        obs, info = self.env.reset(seed=seed, options=options)
        recorder.start([0], [recorder.obs_to_text(obs)], [info])
        return self._finish(info, handed)

    def step(
        self, action: Any, extras: Mapping[str, Any] | None = None
    ) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step with the model's response (or an env action, without a parser); ``extras``: more
        values to store with this step (e.g. ``{"logprob": -0.3}``)."""
        flow, recorder = self._parts.flow, self._parts.recorder
        plan = flow.plan([action], [0])
        obs, reward, terminated, truncated, info = self.env.step(plan.env_actions[0])
        info = dict(info)
        rewards = np.array([float(reward)])
        boxed = None if extras is None else {k: [v] for k, v in extras.items()}
        verdicts = flow.record(plan, {0: info}, rewards, boxed)
        if verdicts is not None:
            info.update(verdicts.info_at(0))
        text = recorder.obs_to_text(obs)
        handed: list[Episode] = []
        if terminated or truncated:
            won = [bool(info.get(WON, False))]
            handed = recorder.handover([0], [text], [terminated], [truncated], won)
            recorder.observe([0], [text], [{}])
        else:
            recorder.observe([0], [text], [info])
        prompt, info = self._finish(info, handed)
        return prompt, float(rewards[0]), terminated, truncated, info

    def close(self) -> None:
        """Close the memory (files, connections), then the env."""
        self._close_memory()
        super().close()

    def _finish(self, info: dict[str, Any], handed: list[Episode]) -> tuple[Any, dict[str, Any]]:
        self._build([0])
        info = dict(info)
        info["raw_obs"] = self._parts.recorder.state.observation(0)
        info.update({key: self._figures[key][0].item() for key in FIGURES})
        if handed:
            info[EPISODE_HISTORY] = handed[0]
        return self._prompts[0], info

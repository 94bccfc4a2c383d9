"""Model-free policies: ``random`` (baselines), ``scripted`` and ``prompt_oracle`` (experts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Policy, Prompt, episode_seed
from agent_memory.policies.settings import PromptOracleSettings, RandomSettings, ScriptedSettings

__all__ = ["PromptOraclePolicy", "RandomPolicy", "ScriptedPolicy"]


class RandomPolicy(Policy):
    """Uniform over each env's admissible actions, written in the parser's format.

    ``seed``: a prompt whose meta names its episode and step draws the same in any order.
    ``actions``: what to draw from (already formatted) where the env has no finite admissible set;
    without them such envs get an empty response (an invalid action).

    Example:
        >>> p = RandomPolicy(seed=1, actions=["<answer>42</answer>"])
        >>> meta = [{"admissible_actions": ["up", "down"]}, {"admissible_actions": None}]
        >>> p.act(["a", "b"], meta)
        ['<action>up</action>', '<answer>42</answer>']
    """

    settings_class = RandomSettings

    needs: frozenset[str] = frozenset({"admissible_actions"})
    runs_in: ClassVar = "worker"

    def __init__(
        self,
        parser: ActionParser | None = None,
        seed: int | None = RandomSettings.seed,
        actions: Sequence[str] | None = RandomSettings.actions,
    ) -> None:
        super().__init__(parser)
        if isinstance(actions, str):
            # list("<answer>42</answer>") would draw single characters.
            raise ValueError(f"actions must be a list of responses, got the string {actions!r}")
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.actions = [] if actions is None else [str(a) for a in actions]

    def act(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        meta = [{} for _ in prompts] if meta is None else meta
        if len(meta) != len(prompts):
            raise ValueError(
                f"meta must hold one dict per prompt: got {len(meta)} for {len(prompts)} prompts"
            )
        out = []
        for m in meta:
            options = m.get("admissible_actions")
            # len(), not truth: envs may hand admissible actions over as a numpy array.
            if options is not None and len(options) > 0:
                out.append(self.parser.format(str(options[self._draw(m, len(options))])))
            elif self.actions:
                out.append(self.actions[self._draw(m, len(self.actions))])
            else:
                out.append("")
        return out

    def _draw(self, meta: Mapping[str, Any], n: int) -> int:
        """An index below ``n``: from the episode's seed when ``meta`` names the episode and
        step (the seed is a uniform 31-bit hash, so its remainder is uniform to within
        ``n / 2**31``; a NumPy generator per draw would cost 10x more), else from the
        policy's own RNG."""
        if self.seed is not None and "traj_uid" in meta and "step" in meta:
            return episode_seed(self.seed, meta["traj_uid"], meta["step"]) % n
        return int(self.rng.integers(n))


class ScriptedPolicy(Policy):
    """Plays each env's oracle (``env.unwrapped.oracle_action()``), in the parser's format.

    Example:
        >>> ScriptedPolicy().act(["p"], [{"oracle_action": "left"}])
        ['<action>left</action>']
    """

    settings_class = ScriptedSettings
    needs: frozenset[str] = frozenset({"oracle_action"})
    runs_in: ClassVar = "worker"

    def act(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        if meta is None or len(meta) != len(prompts):
            raise ValueError(
                "the scripted policy needs meta with an 'oracle_action' per prompt (the rollout "
                "provides it; when calling act yourself pass meta=[{'oracle_action': ...}, ...])"
            )
        out = []
        for m in meta:
            action = m.get("oracle_action")
            if action is None:
                raise ValueError(
                    "meta has no 'oracle_action': the env must implement oracle_action() to be "
                    "played by policy=scripted"
                )
            out.append(self.parser.format(str(action)))
        return out


def _text_solver(env_id: str | None, name: str = "solve_from_text") -> Any:
    """The env class's ``solve_from_text(text, options)`` (or other static ``name``), when the
    env has one."""
    if env_id is None:
        return None
    from agent_memory.prepare import entry_point

    return getattr(entry_point(env_id), name, None)


class PromptOraclePolicy(Policy):
    """An expert that uses only what its prompt shows, where the env can say how.

    Envs with a static ``solve_from_text(text, options)`` (Recall) are answered from the prompt
    alone, so success measures what the memory kept; other envs get their true-state oracle.
    With ``memory_tag`` (``memory=notes``) each response also writes ``<tag>note</tag>``: the
    env's ``note_from_text(prompt)``, an expert's note (the env must have one).

    Example:
        >>> p = PromptOraclePolicy(env_id="agent_memory/Recall-v0")
        >>> prompt = "Remember this: the kite is RED. ... Which colour was the kite?"
        >>> p.act([prompt], [{"admissible_actions": ["blue", "red"], "oracle_action": "red"}])
        ['<action>red</action>']
        >>> p.act(["Which colour was the kite?"], [{"admissible_actions": ["blue", "red"]}])
        ['<action>blue</action>']
    """

    settings_class = PromptOracleSettings

    needs: frozenset[str] = frozenset({"admissible_actions", "oracle_action"})
    runs_in: ClassVar = "worker"

    def __init__(
        self,
        parser: ActionParser | None = None,
        env_id: str | None = PromptOracleSettings.env_id,
        memory_tag: str | None = PromptOracleSettings.memory_tag,
    ) -> None:
        super().__init__(parser)
        self.env_id = env_id
        self.solver = _text_solver(env_id)
        self.memory_tag = memory_tag
        self.noter = None if memory_tag is None else _text_solver(env_id, "note_from_text")
        if memory_tag is not None and self.noter is None:
            raise ValueError(
                f"memory_tag={memory_tag!r}: env {env_id!r} has no note_from_text(text), so "
                "policy=prompt_oracle cannot write its notes; pass memory_tag=null"
            )

    def act(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        meta = meta or [{} for _ in prompts]
        out = []
        for prompt, m in zip(prompts, meta, strict=True):
            options = m.get("admissible_actions")
            text = prompt if isinstance(prompt, str) else "\n".join(x["content"] for x in prompt)
            if self.solver is not None and options:
                action = self.solver(text, options)
            else:
                action = m.get("oracle_action")
                if action is None:
                    raise ValueError(
                        f"env {self.env_id!r} has neither solve_from_text nor an oracle_action: "
                        "policy=prompt_oracle cannot play it"
                    )
            response = self.parser.format(str(action))
            if self.noter is not None:
                tag = self.memory_tag
                response = f"<{tag}>{self.noter(text)}</{tag}>{response}"
            out.append(response)
        return out

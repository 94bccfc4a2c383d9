"""The settings of the model-free and local-model policies, declared once (see
:mod:`agent_memory.config_fields`): what ``policy.params`` may set for ``random``, ``scripted``,
``prompt_oracle``, ``hf`` and ``score``, with types, defaults and help. The constructors' keyword
defaults are these; ``configs/policy/*.yaml`` and docs/configuration.md are generated from them.
The ``openai`` policy's are in :mod:`agent_memory.policies.openai_settings`.

Example:
    >>> HFSettings.temperature, HFSettings.top_k
    (1.0, 0)
    >>> from agent_memory.config_fields import config_fields
    >>> [f.name for f in config_fields(RandomSettings)]
    ['seed', 'actions']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent_memory.config_fields import REQUIRED, setting
from agent_memory.protocol import ScoreRule

__all__ = [
    "DType",
    "HFSettings",
    "PromptOracleSettings",
    "RandomSettings",
    "ScoringSettings",
    "ScriptedSettings",
]

#: Weights dtypes a local model loads in.
DType = Literal["auto", "float32", "float16", "bfloat16"]

_PATH_HELP = "Directory with the model and tokenizer (required: pass policy.params.path=...)."
_SEED_HELP = (
    "Sampling seed (null: none): each episode step draws from its own stream, whatever its batch."
)
_CHAT_HELP = "Use the tokenizer's chat template: auto (when it has one), true, false."
_THREADS_HELP = "Torch's (process-wide) thread count (null: torch's own)."


@dataclass(frozen=True)
class RandomSettings:
    """``policy=random``: uniform over each env's admissible actions."""

    seed: int | None = setting(
        None,
        "Seed (a job that leaves it out uses rollout.seed; null: unseeded): a prompt whose "
        "meta names its episode and step draws the same in any order.",
    )
    actions: Sequence[str] | None = setting(
        None,
        "Responses (already formatted) drawn where an env has no finite admissible set (a job "
        "that leaves it out uses env.random_actions; null or empty: such envs get an empty "
        "response).",
    )


@dataclass(frozen=True)
class ScriptedSettings:
    """``policy=scripted``: the envs' oracles; it takes no settings."""


@dataclass(frozen=True)
class PromptOracleSettings:
    """``policy=prompt_oracle``: an expert that answers from its prompt where the env can."""

    env_id: str | None = setting(
        None,
        "The env whose solve_from_text answers the prompt (a job that leaves it out uses env.id).",
    )
    memory_tag: str | None = setting(
        None,
        "With memory=notes: the tag of the note it writes in each response (the env's "
        "note_from_text, an expert's note; null: it writes none).",
    )


@dataclass(frozen=True)
class HFSettings:
    """``policy=hf``: a local Hugging Face causal LM that generates token by token."""

    path: str | None = setting(None, _PATH_HELP, config_default=REQUIRED)
    max_new_tokens: int = setting(256, "Most new tokens per response.")
    temperature: float = setting(
        1.0,
        "Sampling temperature (0: greedy). Every sampling field is sent to generate() from "
        "these settings and recorded in the rows, whatever the model's generation_config.json "
        "asks for; a model whose generation config sets another field that changes the "
        "distribution (e.g. no_repeat_ngram_size, suppress_tokens, min_new_tokens) is refused "
        "with the field named.",
    )
    top_p: float = setting(1.0, "Nucleus mass (1: off).")
    top_k: int = setting(0, "Keep the k likeliest tokens (0: off).")
    min_p: float = setting(
        0.0, "Drop tokens below min_p times the likeliest one's probability (0: off)."
    )
    repetition_penalty: float = setting(
        1.0,
        "Divide (multiply, if negative) the logits of tokens in the prompt and the response "
        "so far (1: off; Qwen2.5-Instruct's generation_config.json asks for 1.05).",
    )
    batch_size: int = setting(8, "Prompts per generate() call (left-padded).")
    device: str = setting("cpu", "cpu, cuda, or auto.")
    dtype: DType = setting("auto", "Weights dtype: auto, float32, bfloat16, float16.")
    seed: int | None = setting(None, _SEED_HELP)
    use_chat_template: bool | Literal["auto"] = setting("auto", _CHAT_HELP)
    stop: str | Sequence[str] | None = setting(
        None, "Stop strings: a response ends before the first (null: none)."
    )
    num_threads: int | None = setting(None, _THREADS_HELP)
    incremental: bool = setting(
        False,
        "Render an episode's growing chat after the ids the model sampled "
        "(rollout.layout=episode).",
    )
    tools: str | Sequence[Mapping[str, Any]] | None = setting(
        None,
        "Tools the chat template renders into every prompt, and the env's actions read from the "
        "responses' tool calls (hermes format: <tool_call>{...}</tool_call>): a list of OpenAI "
        "function schemas (agent_memory.tool_calls.function_tool builds one), or env: each "
        "env's own (its info['tools'], else act(action) with its admissible actions as an "
        "enum; docs/your-own-env.md). null: none, actions are read from tags. Needs a chat "
        "template; the rows record the tools.",
    )


@dataclass(frozen=True)
class ScoringSettings:
    """``policy=score``: a local causal LM that chooses among the admissible actions by the
    likelihood of each."""

    path: str | None = setting(
        None,
        "Directory with the model and tokenizer (required for rollouts: pass "
        "policy.params.path=...).",
        config_default=REQUIRED,
    )
    temperature: float = setting(
        1.0, "Temperature of the softmax over action scores (0: the best-scoring action)."
    )
    batch_size: int = setting(32, "Prompts per forward pass (each with all its candidate actions).")
    device: str = setting("cpu", "cpu, cuda, or auto.")
    dtype: DType = setting("auto", "Weights dtype: auto, float32, bfloat16, float16.")
    seed: int | None = setting(None, _SEED_HELP)
    use_chat_template: bool | Literal["auto"] = setting("auto", _CHAT_HELP)
    num_threads: int | None = setting(None, _THREADS_HELP)
    append_eos: bool = setting(True, "End each candidate with the tokenizer's end token.")
    score_forced: bool = setting(
        False,
        "Also score steps with a single candidate (else a forced action needs no forward pass).",
    )
    action_score: ScoreRule = setting(
        "sum",
        "How an action's score is made from its token log-probs: sum (its log-likelihood) | mean.",
    )
    memory_score: ScoreRule = setting(
        "mean",
        "The same for a memory block (memory=notes): blocks differ by whole lines, and by the "
        "sum the empty block always wins, so the mean (per token) lets RL explore which lines "
        "to keep.",
    )

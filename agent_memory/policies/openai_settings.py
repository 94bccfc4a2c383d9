"""The settings of the ``openai`` policy
(:class:`~agent_memory.policies.openai_client.OpenAIPolicy`), declared once (see
:mod:`agent_memory.config_fields`): its constructor takes them as ``**settings``, and
``configs/policy/openai.yaml`` and docs/configuration.md are generated from them.

A job's defaults differ from a Python caller's in three fields (``config_default``): a job
samples at temperature 1 with at most 512 tokens per response, 32 requests in flight; a Python
caller gets the server's own temperature and length limit and 8 requests in flight.

Example:
    >>> from agent_memory.config_fields import config_default, config_fields
    >>> {f.name: (f.default, config_default(f)) for f in config_fields(OpenAISettings)
    ...  if f.name in ("temperature", "concurrency")}
    {'temperature': (None, 1.0), 'concurrency': (8, 32)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_memory.config_fields import CONFIG_DEFAULT, REQUIRED, setting
from agent_memory.policies.openai_protocol import DEFAULT_MAX_ANSWER_BYTES

__all__ = ["OpenAISettings"]


def _sampling(off: str, what: str) -> str:
    return f"{what} (null: {off}, off)."


@dataclass(frozen=True)
class OpenAISettings:
    """``policy=openai``: any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp, OpenAI)."""

    base_url: str = field(
        metadata={
            "help": "The server's OpenAI API root.",
            CONFIG_DEFAULT: "http://localhost:8000/v1",
        }
    )
    model: str = field(
        metadata={
            "help": "The served model's name (required: pass policy.params.model=...).",
            CONFIG_DEFAULT: REQUIRED,
        }
    )
    mode: Literal["chat", "completion"] = setting(
        "chat",
        "chat (POST /chat/completions) or completion (POST /completions, text prompts only).",
    )
    api_key: str | None = setting(
        None,
        "The API key itself (null: read api_key_env; a key set here is saved with the run's "
        "config, so prefer api_key_env). Never logged.",
    )
    api_key_env: str = setting(
        "OPENAI_API_KEY", "Environment variable holding the API key (never logged)."
    )
    temperature: float | None = setting(
        None,
        'Sampling. Every field is sent explicitly (null: its "off" value: top_p 1, top_k -1, '
        "min_p 0, repetition_penalty 1, presence/frequency_penalty 0), because vLLM fills a "
        "field a request leaves out from the model's generation_config.json; the rows record "
        "what was sent.",
        config_default=1.0,
    )
    top_p: float | None = setting(None, _sampling("1", "Nucleus mass"))
    top_k: int | None = setting(None, _sampling("-1", "Keep the k likeliest tokens"))
    min_p: float | None = setting(
        None, _sampling("0", "Drop tokens below min_p times the likeliest one's probability")
    )
    repetition_penalty: float | None = setting(
        None,
        _sampling("1", "Multiplicative penalty on tokens of the prompt and the response so far"),
    )
    presence_penalty: float | None = setting(
        None, _sampling("0", "Additive penalty on tokens already in the response")
    )
    frequency_penalty: float | None = setting(
        None, _sampling("0", "Additive penalty per occurrence in the response")
    )
    max_tokens: int | None = setting(
        None, "Most tokens per response (null: the server's limit).", config_default=512
    )
    return_tokens: bool = setting(
        True,
        "Record each turn's prompt ids, sampled ids and sampling log-probs (what training "
        "needs). Checked at start: a server that refuses the token fields, or reports raw "
        "log-probs while the sampling above changes the distribution (vLLM's default; start "
        "it with --logprobs-mode processed_logprobs), fails the run before any episode. "
        "false: text only.",
    )
    server: Literal["vllm", "sglang", "openai"] = setting(
        "vllm",
        "Whose request fields: vllm, sglang, or openai (the plain OpenAI API: no top_k, "
        "min_p, repetition_penalty or token ids; needs return_tokens=false).",
    )
    tokenizer: str | None = setting(
        None,
        "The served model's local tokenizer directory (null: none): a request whose answer's "
        "prompt ids are not the prompt's own rendering fails (another request's answer, or a "
        "server rendering differently; without a tokenizer they are trusted), response ids "
        "must decode to the response text, decodes a response a stop string cut (needed with "
        "stop and return_tokens), renders token-in.",
    )
    vocab_size: int | None = setting(
        None,
        "Token ids must be below this (null: the tokenizer's size; without one, ints >= 0). "
        'An answer whose ids, log-probs (finite, <= 0) or text fail the checks is "" '
        "(counted, not retried). Set it to the model's embedding rows when they outnumber the "
        "tokenizer's tokens (Qwen2.5: 151936): with a tokenizer, a sampled id in between "
        "decodes to nothing, and its request fails (policy_stats.padding_id_answers).",
    )
    stop: str | Sequence[str] | None = setting(
        None, "Stop strings (null: none; needs tokenizer with return_tokens, see above)."
    )
    extra_body: Mapping[str, Any] | None = setting(
        None,
        "Further request fields, merged into every request: only those known to leave the "
        "sampled distribution alone (agent_memory/policies/request_fields.py: e.g. "
        "chat_template_kwargs, stop_token_ids, skip_special_tokens, priority). Anything else "
        "is refused before Ray starts: logit_bias, guided or structured decoding, n, and the "
        "sampling fields (set those above). null: none; e.g. "
        "policy.params.extra_body={chat_template_kwargs: {enable_thinking: false}}.",
    )
    tools: str | Sequence[Mapping[str, Any]] | None = setting(
        None,
        "Tools offered with every request, and the env's actions read from the answers' tool "
        "calls (hermes format: <tool_call>{...}</tool_call> in the decoded sampled ids): a list "
        "of OpenAI function schemas (agent_memory.tool_calls.function_tool builds one), or env: "
        "each env's own (its info['tools'], else act(action) with its admissible actions as an "
        "enum; docs/your-own-env.md). null: none, actions are read from tags. Needs mode=chat "
        "(or token_in) and, with return_tokens, tokenizer: the rows record the tools sent and "
        "the prompt ids rendered with them.",
    )
    tool_choice: str | None = setting(
        None,
        "auto or none (null: not sent, the server's default: auto with tools). none: the "
        "server parses no calls, the template still renders the tools and the calls are read "
        "from the text (a vLLM started without --enable-auto-tool-choice refuses auto). "
        "required and a named function are refused: they constrain decoding to a grammar the "
        "log-probs do not show, and vLLM then writes the call as bare JSON, not the hermes "
        "text.",
    )
    seed: int | None = setting(
        None,
        "Sampling seed (null: none): each request's seed comes from (seed, episode, step), so "
        "a rollout samples the same whatever order its requests go out in.",
    )
    token_in: bool = setting(
        False,
        "Token-in: render prompts here with tokenizer's chat template and send the ids (needs "
        "mode=completion); what is recorded is then exactly what the server saw.",
    )
    use_chat_template: bool | Literal["auto"] = setting(
        "auto",
        "With tokenizer: render with its chat template: auto (when it has one), true, false.",
    )
    incremental: bool = setting(
        False,
        "With token_in: render an episode's growing chat after the ids the model sampled "
        "(rollout.layout=episode).",
    )
    concurrency: int = setting(
        8,
        "Requests in flight at once (all async workers together: each starts with an equal "
        "share, which the driver moves to the workers with envs still playing). Set it above "
        "the server's batch slots (e.g. twice vLLM's max_num_seqs) so its queue refills a "
        "freed slot at once.",
        config_default=32,
    )
    timeout: float = setting(
        120.0, "Seconds per request phase (connect, send, wait for the answer)."
    )
    max_answer_bytes: int = setting(
        DEFAULT_MAX_ANSWER_BYTES,
        "Largest answer body, in bytes as received and once inflated (gzip, deflate), "
        "enforced while it is read: a larger answer fails its request, not retried (16 MiB; a "
        "completion of thousands of tokens with log-probs is under 1 MiB).",
    )
    max_retries: int = setting(
        3,
        "Retries of connection errors, timeouts, 408, 429 and 5xx (the start-up server "
        "check's 408, 429 and 5xx too, within timeout).",
    )
    backoff: Sequence[float] = setting(
        (0.5, 8.0),
        "Exponential backoff: first and largest wait, seconds (with jitter; Retry-After is "
        "honoured).",
    )
    max_retry_after: float = setting(
        60.0, "A server's Retry-After is honoured up to this many seconds."
    )
    headers: Mapping[str, str] | None = setting(
        None, "Further HTTP headers sent with every request."
    )
    dead_calls: int = setting(
        2,
        "Calls in a row without any HTTP answer before the server is deemed down "
        "(ServerUnavailable; 0: never).",
    )

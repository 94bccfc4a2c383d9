"""What :class:`~agent_memory.policies.openai_client.OpenAIPolicy` checks before it sends
anything (its settings, each error naming the key to fix) and what it reads from its server
check's answer (the server refuses a field, gives no token ids, or reports log-probs of
another distribution than the one it samples from).

Example:
    >>> check_backoff((0.5, 8))
    (0.5, 8.0)
    >>> check_backoff((2, 1))
    Traceback (most recent call last):
    ...
    ValueError: backoff must satisfy 0 <= base <= max, got (2, 1)
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.checks import check_choice, check_int, check_stop, is_number
from agent_memory.policies.local_model import resolve_model
from agent_memory.policies.openai_protocol import (
    LogprobsKind,
    logprobs_kind,
    read_answer,
    server_message,
)
from agent_memory.policies.openai_runtime import LogprobsNotSampled, ServerRefused
from agent_memory.policies.openai_sender import require_tokens
from agent_memory.policies.rendering import PromptRenderer
from agent_memory.protocol import SamplingParams
from agent_memory.tool_actions import policy_tools

if TYPE_CHECKING:
    from agent_memory.policies.openai_transport import Reply

__all__ = [
    "GREEDY_EPS",
    "check_backoff",
    "check_endpoint",
    "check_logprobs",
    "check_no_tool_fields",
    "check_plain_openai",
    "check_sampling",
    "check_status",
    "check_stops",
    "check_token_in",
    "check_tool_settings",
    "id_bound",
    "load_renderer",
    "plain_values",
    "probe_logprobs",
    "sampling_of",
]

#: Temperatures below this are greedy decoding (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5


def check_endpoint(base_url: str, model: str, mode: str, server: str) -> None:
    """``base_url`` an http(s) URL as the transport parses it, ``model`` a name, ``mode`` and
    ``server`` known ones."""
    if importlib.util.find_spec("httpx") is None:
        raise ImportError('the openai policy needs httpx: pip install "httpx>=0.27"')
    import httpx

    from agent_memory.policies.openai_transport import Target

    try:
        Target(base_url)  # what every request is sent to, parsed as the transport does
    except (TypeError, ValueError, httpx.InvalidURL):
        raise ValueError(
            f"base_url must be an http(s) URL like 'http://localhost:8000/v1', got {base_url!r}"
        ) from None
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty model name, got {model!r}")
    check_choice("mode", mode, ("chat", "completion"))
    check_choice("server", server, ("vllm", "sglang", "openai"))


#: The sampling fields' ranges: (low, high, low excluded, as errors name it); top_k: an int >= -1.
_RANGES = {
    "temperature": (0.0, math.inf, False, "a number >= 0"),
    "top_p": (0.0, 1.0, True, "in (0, 1]"),
    "min_p": (0.0, 1.0, False, "in [0, 1]"),
    "repetition_penalty": (0.0, math.inf, True, "a number > 0"),
    "presence_penalty": (-2.0, 2.0, False, "in [-2, 2]"),
    "frequency_penalty": (-2.0, 2.0, False, "in [-2, 2]"),
}


def check_sampling(values: Mapping[str, Any]) -> None:
    """The sampling fields, each None (the server's default) or in its range."""
    for name, value in values.items():
        if name == "top_k":
            check_int(name, value, -1, allow_none=True)
            continue
        low, high, open_, shown = _RANGES[name]
        if value is not None and (
            not is_number(value) or value > high or (value <= low if open_ else value < low)
        ):
            raise ValueError(f"{name} must be {shown} or None, got {value!r}")


def check_plain_openai(
    top_k: int | None, min_p: float | None, repetition_penalty: float | None, return_tokens: bool
) -> None:
    """``server='openai'`` takes none of the fields only vLLM and SGLang know."""
    vllm_only = {"top_k": top_k, "min_p": min_p, "repetition_penalty": repetition_penalty}
    given = [k for k, v in vllm_only.items() if v is not None]
    if given or return_tokens:
        what = ", ".join(given) if given else "return_tokens=True"
        raise ValueError(
            f"server='openai' (the plain OpenAI API) takes no {what}: it returns no token "
            "ids and knows no top_k, min_p or repetition_penalty. Pass "
            "return_tokens=False for text only, or server='vllm' / 'sglang'"
        )


def check_backoff(backoff: Sequence[float]) -> tuple[float, float]:
    """``backoff`` as (base, max) seconds, ``0 <= base <= max`` (see the module example)."""
    given = tuple(backoff) if isinstance(backoff, Sequence) else (backoff,)
    if len(given) != 2 or not all(is_number(b) for b in given):
        raise ValueError(f"backoff must be two numbers (base, max) in seconds, got {given!r}")
    if not 0 <= given[0] <= given[1]:
        raise ValueError(f"backoff must satisfy 0 <= base <= max, got {given!r}")
    return float(given[0]), float(given[1])


def check_token_in(token_in: bool, tokenizer: str | None, incremental: bool, mode: str) -> None:
    """Token-id prompts need a tokenizer and ``/v1/completions``; ``incremental`` needs them."""
    if token_in and tokenizer is None:
        raise ValueError(
            "token_in=True renders prompts locally: pass tokenizer=<the served model's local "
            "tokenizer directory or cached hub id>"
        )
    if incremental and not token_in:
        raise ValueError(
            "incremental=True renders token-id prompts: pass token_in=True (and a tokenizer)"
        )
    if token_in and mode != "completion":
        raise ValueError(
            "token_in=True sends token ids, which only /v1/completions takes: pass "
            "mode='completion' (the chat template is applied locally)"
        )


def check_stops(
    stop: str | Sequence[str] | None, return_tokens: bool, tokenizer: str | None
) -> list[str] | None:
    """``stop`` as a list (None: none); with ``return_tokens``, only with a tokenizer."""
    stops = check_stop(stop)
    if stops is not None and return_tokens and tokenizer is None:
        raise ValueError(
            f"stop={stops!r} with return_tokens=True needs a tokenizer: a server cuts the "
            "text before a stop string but returns the ids of the whole token holding "
            "it, so the text would not be what the recorded ids say. Pass "
            "tokenizer=<the served model's directory> (the response text is then "
            "decoded from the ids), or drop stop, or return_tokens=False"
        )
    return stops


#: Each number field of :class:`SamplingParams` and the type its value is read as.
SAMPLING_KINDS: tuple[tuple[str, type], ...] = tuple(
    (name, int if name in ("top_k", "max_tokens", "seed") else float)
    for name in SamplingParams.__dataclass_fields__
    if name not in ("tools", "tool_choice")
)


def sampling_text(sampling: SamplingParams) -> str:
    shown = {k: v for k, v in sampling.__dict__.items() if k not in ("seed", "max_tokens")}
    return ", ".join(f"{k}={v}" for k, v in shown.items() if v is not None)


def plain_values(value: Any) -> Any:
    """``value`` in plain dicts and lists (a Hydra DictConfig is a Mapping, not JSON)."""
    if isinstance(value, Mapping):
        return {str(k): plain_values(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain_values(v) for v in value]
    return value


def id_bound(vocab_size: int | None, renderer: PromptRenderer | None) -> int | None:
    """The bound on token ids: as configured, else the tokenizer's size (None: unknown)."""
    return vocab_size if vocab_size is not None or renderer is None else len(renderer.tokenizer)


def load_renderer(
    tokenizer: str,
    use_chat_template: bool | Literal["auto"],
    incremental: bool,
    template_kwargs: Mapping[str, Any] | None,
) -> PromptRenderer:
    """The renderer of the local ``tokenizer`` (a directory or a cached hub id)."""
    from transformers import AutoTokenizer

    path = resolve_model(tokenizer, need="tokenizer")
    loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return PromptRenderer(
        loaded,
        use_chat_template,
        str(path),
        incremental=incremental,
        template_kwargs=template_kwargs,
    )


def sampling_of(body: Mapping[str, Any]) -> SamplingParams:
    """The sampling a request's body asks for (``extra_body`` merged in).

    Example:
        >>> sampling_of({"temperature": 0.7, "top_k": 5.0, "model": "m"}).top_k
        5
    """
    values: dict[str, Any] = {
        name: kind(value) if is_number(value := body.get(name)) else None
        for name, kind in SAMPLING_KINDS
    }
    tools, choice = body.get("tools"), body.get("tool_choice")
    values["tools"] = None if tools is None else json.dumps(tools)
    values["tool_choice"] = None if choice is None else str(choice)
    return SamplingParams(**values)


def check_no_tool_fields(extra_body: Mapping[str, Any]) -> None:
    """``extra_body`` sets neither ``tools`` nor ``tool_choice``: the policy's settings send
    them (and the rows record them).

    Example:
        >>> check_no_tool_fields({"tool_choice": "auto"})
        Traceback (most recent call last):
        ...
        ValueError: extra_body.tool_choice is a field the policy writes itself \
(policy.params.tool_choice decides it): remove policy.params.extra_body.tool_choice
    """
    for key in ("tools", "tool_choice"):
        if key in extra_body:
            raise ValueError(
                f"extra_body.{key} is a field the policy writes itself (policy.params.{key} "
                f"decides it): remove policy.params.extra_body.{key}"
            )


def check_tool_settings(
    tools: Any,
    tool_choice: Any,
    mode: str,
    token_in: bool,
    return_tokens: bool,
    tokenizer: str | None,
    incremental: bool,
) -> list[dict[str, Any]] | Literal["env"] | None:
    """``tools`` as the policy sends them (a checked list, ``"env"`` or None), with what they
    need (see ``policy.params.tools`` and ``tool_choice``).

    Example:
        >>> check_tool_settings("env", "auto", "chat", False, False, None, False)
        'env'
        >>> check_tool_settings("env", "required", "chat", False, False, None, False)
        Traceback (most recent call last):
        ...
        ValueError: tool_choice must be 'auto', 'none' or null, got 'required': a call forced \
by tool_choice is decoded under a grammar (a distribution the log-probs do not show), and vLLM \
writes it as bare JSON, not the hermes text the actions are read from; remove \
policy.params.tool_choice
    """
    if tool_choice is not None and tool_choice not in ("auto", "none"):
        raise ValueError(
            f"tool_choice must be 'auto', 'none' or null, got {tool_choice!r}: a call forced by "
            "tool_choice is decoded under a grammar (a distribution the log-probs do not show), "
            "and vLLM writes it as bare JSON, not the hermes text the actions are read from; "
            "remove policy.params.tool_choice"
        )
    if tools is None:
        if tool_choice is not None:
            raise ValueError(
                f"tool_choice={tool_choice!r} without tools: set policy.params.tools (a list of "
                "function schemas, or env), or remove policy.params.tool_choice"
            )
        return None
    if mode != "chat" and not token_in:
        raise ValueError(
            "tools are rendered by the chat template: pass policy.params.mode=chat (or "
            "token_in=true with a tokenizer that has a chat template), or remove "
            "policy.params.tools"
        )
    if return_tokens and tokenizer is None:
        raise ValueError(
            "tools with return_tokens=true need policy.params.tokenizer: a server that parses "
            "tool calls answers content null, so the response text is decoded here from the "
            "sampled ids (and its prompt ids checked against the template rendered with the "
            "tools); or pass return_tokens=false"
        )
    if incremental:
        raise ValueError(
            "tools with incremental=true: an episode's turns are not rendered incrementally with "
            "tools; pass policy.params.incremental=false, or remove policy.params.tools"
        )
    return policy_tools(tools)


def check_status(response: Reply, url: str, tools: bool = False) -> None:
    """The server check's answer is a 200 (``tools``: the check offered tools).

    Raises:
        ServerRefused: it is not (a 4xx: the server refuses a field the policy sends).
    """
    status = response.status_code
    if status != 200:
        raise ServerRefused(
            f"the server at {url} refused the policy's request: HTTP {status}: "
            f"{server_message(response)}. If it refuses a sampling field (top_k, min_p, "
            "repetition_penalty: vLLM and SGLang take them), pass policy.params.server="
            "openai; if it refuses the token fields (return_token_ids, logprobs), pass "
            "policy.params.return_tokens=false (rows then hold no token ids or log-probs)"
            + (
                "; if it refuses tools with tool_choice auto (a vLLM started without a "
                "tool-call parser), pass policy.params.tool_choice=none (the calls are read "
                "from the text)"
                if tools
                else ""
            )
        )


def probe_logprobs(
    response: Reply, mode: Literal["chat", "completion"], url: str, server: str, token_in: bool
) -> LogprobsKind | None:
    """Which log-probs the server check's 200 answer holds (None: it does not parse; the
    requests' own checks name what is wrong with an answer).

    Raises:
        TokenIdsMissing: the answer holds no ids or log-probs.
    """
    try:
        data = response.json()
        answer = read_answer(data, mode)
    except Exception:  # whatever the parse raises (e.g. RecursionError): not the check's
        return None
    # Token-in: the prompt ids are the ones sent, whether or not the server echoes them.
    prompt_ids = [] if token_in else answer.prompt_ids
    require_tokens(url, server, prompt_ids, answer.response_ids, answer.logprobs)
    return logprobs_kind(data, mode)


def check_logprobs(kind: LogprobsKind, url: str, sampling: SamplingParams) -> None:
    """Log-probs of ``kind`` are those of the distribution ``sampling`` samples from.

    Raises:
        LogprobsNotSampled: raw (or unknown) log-probs with sampling that changes the
            distribution.
    """
    greedy = sampling.temperature is not None and sampling.temperature < GREEDY_EPS
    if kind != "processed" and not greedy and not sampling.untransformed:
        what = (
            "the raw model's log-probs (before temperature, top-k, top-p, min-p and penalties)"
            if kind == "raw"
            else "log-probs whose kind a one-token check could not tell"
        )
        raise LogprobsNotSampled(
            f"the server at {url} reports {what}, not those of the distribution it "
            f"samples from with {sampling_text(sampling)}: the rows would hold wrong "
            "log-probs for training. Start vLLM with --logprobs-mode processed_logprobs; "
            "or sample from the model's own distribution (policy.params.temperature=1.0, "
            "top_p, top_k, min_p and the penalties off); or record no tokens "
            "(policy.params.return_tokens=false)"
        )

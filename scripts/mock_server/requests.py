"""Request JSON -> typed requests, with vLLM's / SGLang's field names, defaults and checks.

Unknown fields are ignored, as both servers do; what the mock does not support (``n`` > 1,
``stream``, ``echo``, prompt batches) and out-of-range fields are refused with a 400 naming the
field. A sampling field left out is None here: the server fills in its defaults.

Example:
    >>> req = parse_completion({"prompt": [5, 6], "logprobs": 1, "return_token_ids": True})
    >>> req.prompt, req.max_tokens, req.logprobs, req.return_token_ids
    ((5, 6), 16, 1, True)
    >>> parse_completion({"prompt": "hi", "n": 2})
    Traceback (most recent call last):
    ...
    mock_server.requests.RequestError: n=2: the mock server returns one choice ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent_memory.checks import is_int, is_number
from mock_server.backends import ChatMessage, RequestSampling

__all__ = [
    "MAX_LOGPROBS",
    "NEUTRAL_SAMPLING",
    "ChatRequest",
    "CompletionRequest",
    "Dialect",
    "GenerateRequest",
    "RequestError",
    "SamplingOptions",
    "parse_chat",
    "parse_completion",
    "parse_generate",
]

Dialect = Literal["vllm", "sglang"]

#: Most log-probs per position (vLLM's ``--max-logprobs`` default).
MAX_LOGPROBS = 20
#: What a sampling field left out means when the server has no default for it (vLLM's
#: ``_DEFAULT_SAMPLING_PARAMS`` of its completion and chat requests).
NEUTRAL_SAMPLING: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


class RequestError(Exception):
    """A request the server refuses; rendered in the dialect's error JSON.

    Attributes:
        message: What was wrong and what to send instead.
        status: HTTP status.
        kind: vLLM's error ``type`` (``BadRequestError``, ``NotFoundError``, ...).
        param: The offending request field, if one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling fields shared by every endpoint; None: not sent (limits and defaults are
    resolved later, by :meth:`params`)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False

    def params(
        self, max_tokens: int, top_logprobs: int, defaults: Mapping[str, Any] | None = None
    ) -> RequestSampling:
        """These options with the token limit and number of alternatives; a field not sent takes
        ``defaults[field]`` if there, else :data:`NEUTRAL_SAMPLING`'s (vLLM's priority).

        Example:
            >>> SamplingOptions(top_p=0.5).params(8, 0, {"temperature": 0.6, "top_p": 0.9})
            ... # doctest: +ELLIPSIS
            RequestSampling(max_tokens=8, temperature=0.6, top_p=0.5, top_k=0, ...)
        """
        defaults = defaults or {}
        resolved: dict[str, Any] = {
            name: type(neutral)(
                value if (value := getattr(self, name)) is not None else defaults.get(name, neutral)
            )
            for name, neutral in NEUTRAL_SAMPLING.items()
        }
        return RequestSampling(
            max_tokens=max_tokens,
            **resolved,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            top_logprobs=top_logprobs,
        )


@dataclass(frozen=True)
class CompletionRequest:
    """``POST /v1/completions``. ``prompt``: text, or token ids (token-in); ``max_tokens``
    None (SGLang's dialect only): up to the context length."""

    model: str | None
    prompt: str | tuple[int, ...]
    max_tokens: int | None
    options: SamplingOptions
    logprobs: int | None
    return_token_ids: bool
    return_tokens_as_token_ids: bool


@dataclass(frozen=True)
class ChatRequest:
    """``POST /v1/chat/completions``. ``max_tokens`` None: the server's default, at most the
    context left. ``input_ids`` (replacing the rendered template), ``return_prompt_token_ids``
    and ``return_meta_info`` are SGLang's; ``stream`` (vLLM only) streams the answer, its usage
    too with ``include_usage``."""

    model: str | None
    messages: tuple[ChatMessage, ...]
    max_tokens: int | None
    options: SamplingOptions
    logprobs: bool
    top_logprobs: int
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    return_prompt_token_ids: bool = False
    return_meta_info: bool = False
    input_ids: tuple[int, ...] | None = None
    #: The request's tools (OpenAI function schemas; None: none) and its ``tool_choice``.
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: Any = None
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class GenerateRequest:
    """SGLang's native ``POST /generate``: ``text`` or ``input_ids`` plus ``sampling_params``."""

    text: str | None
    input_ids: tuple[int, ...] | None
    max_new_tokens: int
    options: SamplingOptions
    return_logprob: bool
    top_logprobs_num: int
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _int(
    body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None
) -> Any:
    """``body[name]`` as an int in ``[low, high]``; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise RequestError(f"{name} must be an integer {bound}, got {value!r}", param=name)
    return int(value)


def _number(
    body: dict[str, Any],
    name: str,
    default: float | None,
    *,
    low: float,
    low_open: bool,
    high: float | None = None,
) -> float | None:
    """``body[name]`` as a finite number in the range; ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    ok = is_number(value) and (value > low if low_open else value >= low)
    if not ok or (high is not None and value > high):
        upper = "inf)" if high is None else f"{high:g}]"
        bound = ("(" if low_open else "[") + f"{low:g}, {upper}"
        raise RequestError(f"{name} must be a number in {bound}, got {value!r}", param=name)
    return float(value)


def _token_ids(value: Any, name: str) -> tuple[int, ...] | None:
    """``value`` as token ids when it is a list of ints, None when it is not a list of ints."""
    if isinstance(value, list) and value and all(is_int(v) for v in value):
        if any(v < 0 for v in value):
            raise RequestError(f"{name}: token ids must be >= 0, got {value!r}", param=name)
        return tuple(int(v) for v in value)
    return None


def _input_ids(value: Any, param: str | None) -> tuple[int, ...]:
    """``value`` as the token ids ``input_ids`` must be (``param``: the field the error names)."""
    ids = _token_ids(value, "input_ids")
    if ids is None:
        raise RequestError(
            f"input_ids must be a non-empty list of token ids, got {value!r}", param=param
        )
    return ids


def _unsupported(body: dict[str, Any], stream: bool = False) -> None:
    """Refuse what the mock does not serve (``stream``: a stream is served)."""
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(
            f"n={n!r}: the mock server returns one choice per request; send n=1 (or omit it) "
            "and make several requests",
            param="n",
        )
    if body.get("stream") and not stream:
        raise RequestError(
            "stream=true is not supported by the mock server; send stream=false (or omit it)",
            param="stream",
        )
    if body.get("echo"):
        raise RequestError(
            "echo=true is not supported by the mock server; send echo=false (or omit it) and "
            "use return_token_ids for the prompt ids",
            param="echo",
        )


def _options(body: dict[str, Any], dialect: Dialect) -> SamplingOptions:
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise RequestError(
            f"stop must be a string or a list of strings, got {stop!r}", param="stop"
        )
    if any(not s for s in stops):
        raise RequestError(f"stop strings must be non-empty, got {list(stops)!r}", param="stop")
    seed = body.get("seed", body.get("sampling_seed"))
    if seed is not None and (not is_int(seed) or not -(2**63) <= seed < 2**63):
        raise RequestError(f"seed must be a 64-bit integer or null, got {seed!r}", param="seed")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is None:
        stop_token_ids: tuple[int, ...] = ()
    elif isinstance(stop_ids, list) and all(is_int(i) and i >= 0 for i in stop_ids):
        stop_token_ids = tuple(dict.fromkeys(int(i) for i in stop_ids))
    else:
        raise RequestError(
            f"stop_token_ids must be a list of token ids (integers >= 0), got {stop_ids!r}",
            param="stop_token_ids",
        )
    # vLLM: SamplingParams._verify_args (top_k: the request's integer field).
    top_k = _int(body, "top_k", None, low=-1)
    if dialect == "sglang" and top_k is None:
        top_k = -1
    return SamplingOptions(
        temperature=_number(body, "temperature", None, low=0, low_open=False, high=2.0),
        top_p=_number(body, "top_p", None, low=0, low_open=True, high=1.0),
        top_k=top_k,
        min_p=_number(body, "min_p", None, low=0, low_open=False, high=1.0),
        repetition_penalty=_number(body, "repetition_penalty", None, low=0, low_open=True),
        presence_penalty=_number(body, "presence_penalty", None, low=-2, low_open=False, high=2),
        frequency_penalty=_number(body, "frequency_penalty", None, low=-2, low_open=False, high=2),
        seed=None if seed is None else int(seed),
        stop=stops,
        stop_token_ids=stop_token_ids,
        ignore_eos=_bool(body, "ignore_eos"),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output"),
    )


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string, got {model!r}", param="model")
    return model


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_completion(body: Any, dialect: Dialect = "vllm") -> CompletionRequest:
    """Check a ``/v1/completions`` body.

    Example:
        >>> parse_completion({"prompt": ["one prompt"], "max_tokens": 4}).prompt
        'one prompt'
    """
    body = _object(body)
    _unsupported(body)
    prompt = body.get("prompt")
    # A batch of exactly one prompt is that prompt; larger batches are refused.
    if isinstance(prompt, list) and prompt and all(isinstance(p, (list, str)) for p in prompt):
        if len(prompt) != 1:
            raise RequestError(
                f"prompt is a batch of {len(prompt)} prompts; the mock server answers one prompt "
                f"per request: send {len(prompt)} requests",
                param="prompt",
            )
        prompt = prompt[0]
    ids = _token_ids(prompt, "prompt")
    if ids is None and not (isinstance(prompt, str) and prompt):
        raise RequestError(
            f"prompt must be a non-empty string or a non-empty list of token ids, got {prompt!r}",
            param="prompt",
        )
    logprobs = _int(body, "logprobs", None, low=0, high=MAX_LOGPROBS)
    # Absent: 16 (vLLM's and SGLang's default). An explicit null: 16 too in vLLM (its
    # ``normalize_null_max_tokens``), up to the context length in SGLang's dialect.
    if body.get("max_tokens", 16) is None and dialect == "sglang":
        max_tokens = None
    else:
        max_tokens = _int(body, "max_tokens", 16, 1)
    return CompletionRequest(
        model=_model(body),
        prompt=ids if ids is not None else prompt,
        max_tokens=max_tokens,
        options=_options(body, dialect),
        logprobs=logprobs,
        return_token_ids=_bool(body, "return_token_ids"),
        return_tokens_as_token_ids=_bool(body, "return_tokens_as_token_ids"),
    )


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError(
            f"messages must be a non-empty list of {{'role', 'content'}} objects, got {value!r}",
            param="messages",
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(
                f"messages[{i}] must be an object with a string 'role', got {m!r}",
                param="messages",
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined by newlines
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = "\n".join(t for t in texts if isinstance(t, str))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise RequestError(
                f"messages[{i}].content must be a string, a list of parts or null, got {content!r}",
                param="messages",
            )
        out.append(ChatMessage(role=m["role"], content=content))
    return tuple(out)


def parse_chat(body: Any, dialect: Dialect = "vllm") -> ChatRequest:
    """Check a ``/v1/chat/completions`` body.

    Example:
        >>> r = parse_chat({"messages": [{"role": "user", "content": "hi"}], "logprobs": True})
        >>> r.messages, r.max_tokens, r.top_logprobs
        ((ChatMessage(role='user', content='hi'),), None, 0)
    """
    body = _object(body)
    _unsupported(body, stream=dialect == "vllm")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {options!r}")
    logprobs = _bool(body, "logprobs")
    top = body.get("top_logprobs")
    top_logprobs = _int(body, "top_logprobs", 0, low=0, high=MAX_LOGPROBS)
    if top and not logprobs:
        raise RequestError(
            f"top_logprobs={top} needs logprobs=true; send logprobs=true, or drop top_logprobs",
            param="top_logprobs",
        )
    max_tokens = _int(body, "max_completion_tokens", None, low=1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", None, low=1)
    input_ids = None
    if dialect == "sglang" and body.get("input_ids") is not None:
        input_ids = _input_ids(body["input_ids"], "input_ids")
    return ChatRequest(
        model=_model(body),
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        options=_options(body, dialect),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        return_token_ids=_bool(body, "return_token_ids"),
        return_tokens_as_token_ids=dialect == "vllm" and _bool(body, "return_tokens_as_token_ids"),
        return_prompt_token_ids=dialect == "sglang" and _bool(body, "return_prompt_token_ids"),
        return_meta_info=dialect == "sglang" and _bool(body, "return_meta_info"),
        input_ids=input_ids,
        tools=_tools(body.get("tools")),
        tool_choice=body.get("tool_choice"),
        stream=_bool(body, "stream"),
        include_usage=bool(body.get("stream") and (options or {}).get("include_usage")),
    )


def _tools(value: Any) -> tuple[dict[str, Any], ...] | None:
    """A request's ``tools``: a list of function tools, as vLLM takes them (None: none)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in value
    ):
        raise RequestError(
            f"tools must be a list of function tools, got {value!r}"[:200], param="tools"
        )
    return tuple(value)


def parse_generate(body: Any) -> GenerateRequest:
    """Check an SGLang ``/generate`` body (one prompt: ``text`` or ``input_ids``).

    Example:
        >>> r = parse_generate({"input_ids": [4, 5], "return_logprob": True,
        ...                     "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
        >>> r.input_ids, r.max_new_tokens, r.options.temperature, r.return_logprob
        ((4, 5), 8, 0.0, True)
    """
    body = _object(body)
    if body.get("stream"):
        raise RequestError("stream=true is not supported by the mock server; send stream=false")
    text, input_ids = body.get("text"), body.get("input_ids")
    batched_ids = isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)
    if isinstance(text, list) or batched_ids:
        raise RequestError(
            "batched text/input_ids: the mock server answers one prompt per request; "
            "send one request per prompt"
        )
    ids = None
    if input_ids is not None:
        ids = _input_ids(input_ids, None)
    elif not (isinstance(text, str) and text):
        raise RequestError(
            f"send either a non-empty 'text' or 'input_ids'; got text={text!r}, input_ids=None"
        )
    sampling = body.get("sampling_params") or {}
    if not isinstance(sampling, dict):
        raise RequestError(f"sampling_params must be an object, got {sampling!r}")
    return GenerateRequest(
        text=text if ids is None else None,
        input_ids=ids,
        max_new_tokens=_int(sampling, "max_new_tokens", 128, low=1),
        options=_options(sampling, "sglang"),
        return_logprob=_bool(body, "return_logprob"),
        top_logprobs_num=_int(body, "top_logprobs_num", 0, low=0, high=MAX_LOGPROBS),
        return_text_in_logprobs=_bool(body, "return_text_in_logprobs"),
        return_prompt_token_ids=_bool(body, "return_prompt_token_ids"),
    )

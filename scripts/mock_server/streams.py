"""A chat answer as vLLM 0.32 streams it (``chat_completion_stream_generator``): the role (and,
with ``return_token_ids``, the prompt's ids at the top level) first, then one chunk per sampled
token with its text, its id and its log-prob entry, the finish reason on the last one, the usage
in a chunk without choices when ``stream_options.include_usage`` asks for it, and ``[DONE]``.

Example:
    >>> whole = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
    ...     "prompt_token_ids": [4], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
    ...     "total_tokens": 3, "prompt_tokens_details": None},
    ...     "choices": [{"index": 0, "message": {"content": "hi"}, "logprobs": None,
    ...                  "finish_reason": "stop", "stop_reason": None, "token_ids": [7, 2]}]}
    >>> chunks = chat_chunks(whole, ["hi", ""], include_usage=True)
    >>> chunks[0]["prompt_token_ids"], [c["choices"][0]["delta"] for c in chunks[:3]]
    ([4], [{'role': 'assistant', 'content': ''}, {'content': 'hi'}, {'content': ''}])
    >>> chunks[2]["choices"][0]["finish_reason"], chunks[3]["usage"]["total_tokens"]
    ('stop', 3)
"""

from __future__ import annotations

from typing import Any

__all__ = ["chat_chunks", "text_pieces"]


def text_pieces(decode: Any, ids: list[int], text: str) -> list[str]:
    """Each token's new text, as vLLM's incremental detokenizer shows it: what decoding the
    ids so far adds (never past ``text``, the answer's whole text, cut at a stop string), the
    rest with the last token; joined, they are ``text``.

    Example:
        >>> text_pieces(lambda ids: "".join("ab"[i] for i in ids), [0, 1, 1], "abb")
        ['a', 'b', 'b']
    """
    pieces, shown = [], 0
    for k in range(len(ids)):
        upto = len(text) if k == len(ids) - 1 else min(len(decode(ids[: k + 1])), len(text))
        upto = max(upto, shown)
        pieces.append(text[shown:upto])
        shown = upto
    return pieces


def chat_chunks(
    whole: dict[str, Any], pieces: list[str], include_usage: bool
) -> list[dict[str, Any]]:
    """The stream's chunks of ``whole`` (the vLLM answer without a stream), one per token of
    ``pieces`` (:func:`text_pieces`), each with vLLM's fields (``exclude_unset``)."""
    head = {k: whole[k] for k in ("id", "created", "model")}
    head = {"id": head["id"], "object": "chat.completion.chunk", **head}
    choice = whole["choices"][0]
    ids = choice.get("token_ids")
    entries = (choice.get("logprobs") or {}).get("content")
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
    chunks = [
        {
            **head,
            "choices": [{**first, "finish_reason": None}],
            "prompt_token_ids": whole.get("prompt_token_ids"),
            "prompt_text": None,
        }
    ]
    last = len(pieces) - 1
    for k, piece in enumerate(pieces):
        part: dict[str, Any] = {
            "index": 0,
            "delta": {"content": piece},
            "logprobs": None if entries is None else {"content": [entries[k]]},
            "finish_reason": choice["finish_reason"] if k == last else None,
        }
        if k == last:
            part["stop_reason"] = choice.get("stop_reason")
        part["token_ids"] = None if ids is None else [ids[k]]
        chunks.append({**head, "choices": [part]})
    if include_usage:
        usage = {k: v for k, v in whole["usage"].items() if v is not None}
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks

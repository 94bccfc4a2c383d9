"""``PromptRenderer``: a prompt (text or chat messages) as the exact token ids a model gets.

With a chat template a text prompt becomes one user message; without one, text is tokenized as
it is and a message list is refused (a made-up rendering is a format the model was not trained
on). Shared by the ``hf`` policy and the ``openai`` policy's token-in mode. With
``incremental=True`` an episode's next prompt extends its previous prompt ids and the response ids
actually sampled, so the model never conditions on a re-tokenisation of its own output.

Example:
    >>> from agent_memory.models import build_tiny_lm
    >>> import tempfile, transformers
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["go", "up"])
    >>> renderer = PromptRenderer(transformers.AutoTokenizer.from_pretrained(path))
    >>> renderer.text("go up")
    '<s> user : go up </s> <s> assistant :'
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from agent_memory.protocol import Generation, Prompt

__all__ = ["PromptRenderer", "check_use_chat_template"]


def check_use_chat_template(value: Any) -> bool | Literal["auto"]:
    """``value`` if it is ``True``, ``False`` or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"use_chat_template must be True, False or 'auto', got {value!r}")
    return value


def _as_messages(prompt: object) -> list[dict[str, Any]] | None:
    """``prompt`` as a list of chat messages, or None if it is not a non-empty list of them."""
    if isinstance(prompt, str) or not isinstance(prompt, Sequence) or not prompt:
        return None
    if not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt):
        return None
    return [dict(m) for m in prompt]


@dataclass(frozen=True)
class _Turn:
    """An episode's last rendered turn: its messages and the ids the model conditioned on plus
    the ids it sampled."""

    messages: tuple[tuple[str, str], ...]
    context: tuple[int, ...]


#: Episodes whose last turn an incremental renderer remembers (the oldest are forgotten).
MAX_EPISODES = 4096


class PromptRenderer:
    """Renders prompts for one tokenizer (see the module docstring).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        use_chat_template: ``"auto"``, ``True`` or ``False``.
        source: how to name the tokenizer in errors (e.g. its path).
        incremental: render an episode's growing chat incrementally (see the module docstring).
        template_kwargs: further arguments of the chat template (e.g. ``enable_thinking``), as
            a server's ``chat_template_kwargs`` gives them.

    Raises:
        ValueError: ``use_chat_template=True`` for a tokenizer without a chat template.
    """

    def __init__(
        self,
        tokenizer: Any,
        use_chat_template: bool | Literal["auto"] = "auto",
        source: str = "",
        incremental: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_use_chat_template(use_chat_template)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        where = f"the tokenizer in {source!r}" if source else "the tokenizer"
        if use_chat_template is True and not has_template:
            raise ValueError(
                f"use_chat_template=True but {where} has no chat_template (set one in "
                "tokenizer_config.json, or use_chat_template='auto')"
            )
        self.tokenizer = tokenizer
        self.use_chat_template = use_chat_template
        self.templated = has_template and use_chat_template in (True, "auto")
        self.incremental = incremental
        self.template_kwargs = dict(template_kwargs or {})
        self._where = where
        self._turns: OrderedDict[str, _Turn] = OrderedDict()

    def text(self, prompt: Prompt, index: int = 0, tools: Sequence[Any] | None = None) -> str:
        """The text the model gets for ``prompt`` (after the chat template, if one applies;
        ``tools``: OpenAI function schemas the template renders, None: none).

        Raises:
            ValueError: a message list, or tools, without a chat template to render them, or a
                prompt of another shape.
        """
        if tools is not None and not self.templated:
            raise ValueError(
                f"prompt {index} offers tools but {self._where} renders no chat template "
                "(use_chat_template, or a tokenizer with one): only a chat template renders tools"
            )
        if isinstance(prompt, str):
            if not self.templated:
                return prompt
            messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        elif (chat := _as_messages(prompt)) is not None:
            if not self.templated:
                why = f"{self._where} has no chat_template"
                if self.use_chat_template is False:
                    why = "use_chat_template=False"
                raise ValueError(
                    f"prompt {index} is a chat message list but {why}: use a text formatter, or "
                    "a model whose tokenizer has a chat template"
                )
            messages = chat
        else:
            raise ValueError(
                f"prompt {index} must be a string or a non-empty list of chat messages "
                f"(dicts with 'role' and 'content'), got {prompt!r}"[:300]
            )
        kwargs = self.template_kwargs if tools is None else {**self.template_kwargs, "tools": tools}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **kwargs
        )

    def ids(self, prompt: Prompt, index: int = 0, tools: Sequence[Any] | None = None) -> list[int]:
        """The token ids the model is conditioned on for ``prompt`` (with ``tools``, see
        :meth:`text`).

        Raises:
            ValueError: as :meth:`text`, or an empty prompt with no BOS token to start from.
        """
        text = self.text(prompt, index, tools)
        # A chat template writes its own special tokens (BOS); raw text gets the tokenizer's.
        ids = list(self.tokenizer(text, add_special_tokens=not self.templated)["input_ids"])
        if not ids:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise ValueError(
                    f"prompt {index} is empty after tokenization and the tokenizer has no BOS "
                    "token to start from"
                )
            ids = [bos]
        return ids

    def episode_ids(
        self,
        prompt: Prompt,
        episode: str | None,
        index: int = 0,
        tools: Sequence[Any] | None = None,
    ) -> list[int]:
        """:meth:`ids`, or — with ``incremental`` and a chat ``prompt`` that extends episode
        ``episode``'s last turn (see :meth:`remember`) — that turn's ids and sampled ids, then
        the new messages' tokens. With ``tools``: :meth:`ids` (never incremental)."""
        if tools is not None:
            return self.ids(prompt, index, tools)
        turn = self._turns.get(episode) if self.incremental and episode is not None else None
        if turn is not None and isinstance(prompt, Sequence) and not isinstance(prompt, str):
            suffix = self._suffix(turn, prompt, index)
            if suffix is not None:
                return [*turn.context, *suffix]
        return self.ids(prompt, index)

    def remember(
        self, episode: str, prompt: Prompt, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> None:
        """Episode ``episode``'s turn: the model got ``prompt`` as ``prompt_ids`` and sampled
        ``response_ids`` (no-op unless ``incremental`` and ``prompt`` is a chat)."""
        if not self.incremental or isinstance(prompt, str):
            return
        key = tuple((str(m["role"]), str(m["content"])) for m in prompt)
        self._turns[episode] = _Turn(key, (*prompt_ids, *response_ids))
        self._turns.move_to_end(episode)
        while len(self._turns) > MAX_EPISODES:
            self._turns.popitem(last=False)

    def remember_generations(
        self,
        prompts: Sequence[Prompt],
        meta: Sequence[Mapping[str, Any]],
        generations: Sequence[Generation],
    ) -> None:
        """:meth:`remember` each episode's turn of a call (``meta``'s ``traj_uid``) that has
        token ids (no-op unless ``incremental``)."""
        if not self.incremental:
            return
        for prompt, m, g in zip(prompts, meta, generations, strict=True):
            prompt_ids, response_ids = g.prompt_ids, g.response_ids
            if m.get("traj_uid") is None or prompt_ids is None or response_ids is None:
                continue  # not an episode's, or no token ids
            self.remember(m["traj_uid"], prompt, prompt_ids, response_ids)

    def _suffix(self, turn: _Turn, prompt: Sequence[Any], index: int) -> list[int] | None:
        """The tokens of ``prompt``'s messages after ``turn``'s messages and one assistant
        message, or None when ``prompt`` does not extend ``turn`` that way."""
        old = [{"role": r, "content": c} for r, c in turn.messages]
        n = len(old)
        new = [dict(m) for m in prompt]
        if (
            len(new) < n + 2
            or [(str(m.get("role")), str(m.get("content"))) for m in new[:n]] != list(turn.messages)
            or new[n].get("role") != "assistant"
            or any(m.get("role") == "assistant" for m in new[n + 1 :])
        ):
            return None
        template = partial(self.tokenizer.apply_chat_template, **self.template_kwargs)
        marker = "\x1fREPLY\x1f"  # its text is never used: the ids are
        reply = {"role": "assistant", "content": marker}
        closed = template([*old, reply], tokenize=False)
        full = template([*old, reply, *new[n + 1 :]], tokenize=False, add_generation_prompt=True)
        if not full.startswith(closed) or marker not in closed:
            return None  # the template re-renders earlier turns: no incremental rendering
        # The template's text after the end token (a separator, the new turns, the generation
        # prompt) is what the model reads next; a turn that did not end with the end token
        # (cut by max_tokens or a stop string) first gets the template's text up to it.
        reply_end = closed.rfind(marker) + len(marker)
        eos = self.tokenizer.eos_token
        has_eos = eos and eos in closed[reply_end:]
        end = closed.find(eos, reply_end) + len(eos) if has_eos else len(closed)
        encode = self.tokenizer
        closing = list(encode(closed[reply_end:end], add_special_tokens=False)["input_ids"])
        after = list(encode(full[end:], add_special_tokens=False)["input_ids"])
        if closing and list(turn.context[-len(closing) :]) == closing:
            return after
        return closing + after

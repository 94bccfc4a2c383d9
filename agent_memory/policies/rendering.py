"""``PromptRenderer``: a prompt (text or chat messages) as the exact token ids a model gets.

With a chat template (``use_chat_template`` ``"auto"`` when the tokenizer has one, or ``True``), a
text prompt becomes one user message and the template adds the generation prompt; a message list
is rendered as it is. Without one, text is tokenized as it is (with the tokenizer's special
tokens, e.g. BOS), and a message list is refused: a made-up rendering would give the model a
format it was not trained on. Shared by the ``hf`` policy and the ``openai`` policy's token-in
mode, so both condition the model on the same ids.

Example:
    >>> from agent_memory.models import build_tiny_lm
    >>> import tempfile, transformers
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["go", "up"])
    >>> renderer = PromptRenderer(transformers.AutoTokenizer.from_pretrained(path))
    >>> renderer.text("go up")
    '<s> user : go up </s> <s> assistant :'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agent_memory.protocol import Prompt

__all__ = ["PromptRenderer", "check_use_chat_template"]


def check_use_chat_template(value: Any) -> bool | Literal["auto"]:
    """``value`` if it is ``True``, ``False`` or ``"auto"``."""
    if not (isinstance(value, bool) or value == "auto"):
        raise ValueError(f"use_chat_template must be True, False or 'auto', got {value!r}")
    return value


class PromptRenderer:
    """Renders prompts for one tokenizer (see the module docstring).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        use_chat_template: ``"auto"``, ``True`` or ``False``.
        source: how to name the tokenizer in errors (e.g. its path).

    Raises:
        ValueError: ``use_chat_template=True`` for a tokenizer without a chat template.
    """

    def __init__(
        self, tokenizer: Any, use_chat_template: bool | Literal["auto"] = "auto", source: str = ""
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
        self._where = where

    def text(self, prompt: Prompt, index: int = 0) -> str:
        """The text the model gets for ``prompt`` (after the chat template, if one applies).

        Raises:
            ValueError: a message list without a chat template to render it, or a prompt of
                another shape.
        """
        if isinstance(prompt, str):
            if not self.templated:
                return prompt
            messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        elif (
            isinstance(prompt, Sequence)
            and prompt
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
        ):
            if not self.templated:
                why = (
                    "use_chat_template=False"
                    if self.use_chat_template is False
                    else f"{self._where} has no chat_template"
                )
                raise ValueError(
                    f"prompt {index} is a chat message list but {why}: use a text formatter, or "
                    "a model whose tokenizer has a chat template"
                )
            messages = [dict(m) for m in prompt]
        else:
            raise ValueError(
                f"prompt {index} must be a string or a non-empty list of chat messages "
                f"(dicts with 'role' and 'content'), got {prompt!r}"[:300]
            )
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def ids(self, prompt: Prompt, index: int = 0) -> list[int]:
        """The token ids the model is conditioned on for ``prompt``.

        Raises:
            ValueError: as :meth:`text`, or an empty prompt with no BOS token to start from.
        """
        text = self.text(prompt, index)
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

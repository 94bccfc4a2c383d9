"""A tiny causal LM built offline: a ``transformers`` config with random weights and a word-level
tokenizer over an environment's vocabulary, saved with ``save_pretrained`` so it loads by path.

The tokenizer splits with the ``Whitespace`` pre-tokenizer, keeps case and adds no BOS (the chat
template writes ``<s>``); decoding joins tokens with spaces, so ``encode(decode(ids)) == ids``:
the property token-in/token-out rollouts rely on.

Example:
    >>> import tempfile
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> root = tempfile.mkdtemp()
    >>> words = words_from_texts(["Push the box left.", "<action>left</action>"])
    >>> words
    ['Push', 'the', 'box', 'left', '.', '<', 'action', '>', '</']
    >>> path = build_tiny_lm(f"{root}/lm", words)
    >>> tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    >>> tok.decode(tok.encode("Push the box left."))
    'Push the box left .'
    >>> tok.apply_chat_template([{"role": "user", "content": "Push the box"}], tokenize=False,
    ...                         add_generation_prompt=True)
    '<s> user : Push the box </s> <s> assistant :'
    >>> model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    >>> model.config.vocab_size == len(tok)
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.checks import check_int

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "DEFAULT_TEMPLATE",
    "ROLES",
    "SPECIAL_TOKENS",
    "build_tiny_lm",
    "tag_tokens",
    "template_words",
    "words_from_texts",
]

#: ``[PAD]``, ``[UNK]``, BOS, EOS: ids 0, 1, 2, 3 of every tiny tokenizer.
SPECIAL_TOKENS: tuple[str, str, str, str] = ("[PAD]", "[UNK]", "<s>", "</s>")

#: Chat roles added to the vocabulary with a chat template (the template prints them).
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

#: One turn is ``<s> role : content </s>``; the generation prompt is ``<s> assistant :``. Token-wise
#: a rendered conversation is the previous render plus the new turn (append-only), and a model
#: answer ending in ``</s>`` is exactly what the next render puts after ``assistant :``.
DEFAULT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant :{% endif %}"
)

# The Whitespace pre-tokenizer's pattern, for the template's literal text (no tokenizers import).
_PIECES = re.compile(r"\w+|[^\w\s]+")
_JINJA = re.compile(r"{%.*?%}|{{.*?}}|{#.*?#}", re.DOTALL)


def words_from_texts(texts: Iterable[str]) -> list[str]:
    """The word-level vocabulary of ``texts``: the distinct pieces of the tokenizer's own
    ``Whitespace`` pre-tokenizer, case kept, in first-seen order (same texts, same ids).

    Args:
        texts: Any strings, e.g. environment observations and the prompts built from them.

    Example:
        >>> words_from_texts(["Box at (2, 3).", "box"])
        ['Box', 'at', '(', '2', ',', '3', ').', 'box']
    """
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.Whitespace()
    seen: dict[str, None] = {}
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"words_from_texts expects strings, got {type(text).__name__}")
        for piece, _ in pre.pre_tokenize_str(text):
            seen.setdefault(piece, None)
    return list(seen)


def template_words(chat_template: str) -> list[str]:
    """The words a chat template prints by itself (its literal text outside ``{% %}``,
    ``{{ }}`` and comments), special tokens excluded, plus :data:`ROLES`.

    Example:
        >>> template_words(DEFAULT_TEMPLATE)
        [':', 'assistant', 'system', 'user', 'tool']
    """
    literal = _JINJA.sub(" ", chat_template)
    for special in SPECIAL_TOKENS:
        literal = literal.replace(special, " ")
    return list(dict.fromkeys([*_PIECES.findall(literal), *ROLES]))


def tag_tokens(tags: Sequence[str]) -> list[str]:
    """The opening and closing marks of ``tags``, in order, each once.

    Example:
        >>> tag_tokens(["memory", "action", "memory"])
        ['<memory>', '</memory>', '<action>', '</action>']

    Raises:
        ValueError: a tag that is not a bare word (``<memory>`` rather than ``memory``).
    """
    marks: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str) or not re.fullmatch(r"\w+", tag):
            raise ValueError(f"tags must be bare tag names like 'memory', got {tag!r}")
        marks.update(dict.fromkeys((f"<{tag}>", f"</{tag}>")))
    return list(marks)


def build_tiny_lm(
    path: str | Path,
    words: Sequence[str],
    *,
    arch: Literal["llama", "gpt2"] = "llama",
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    context: int = 256,
    chat_template: str | None = DEFAULT_TEMPLATE,
    seed: int = 0,
    init_range: float = 0.5,
    tie_embeddings: bool = False,
    lowercase: bool = False,
    tags: Sequence[str] = (),
) -> Path:
    """Save a randomly initialised causal LM and its word-level tokenizer to ``path``.

    Both load with ``from_pretrained(path, local_files_only=True)``. Vocabulary: the
    :data:`SPECIAL_TOKENS` (ids 0-3), then ``words`` in order, then :func:`template_words`.

    Args:
        path: Output directory (created); returned as a :class:`~pathlib.Path`.
        words: The vocabulary, e.g. from :func:`words_from_texts` (single pre-tokenizer pieces).
        arch: ``"llama"`` (``LlamaForCausalLM``) or ``"gpt2"`` (``GPT2LMHeadModel``).
        hidden, layers, heads: Hidden size (a multiple of ``heads``), blocks, attention heads.
        context: Maximum sequence length (position embeddings and ``model_max_length``).
        chat_template: Jinja chat template stored with the tokenizer; None for none.
        seed: Weight seed: same arguments, byte-identical weights (the global RNG is kept).
        init_range: Standard deviation of the initial weights; 0.5 (not transformers' 0.02)
            makes a random model say varied things rather than one token forever.
        tie_embeddings: Share the input embedding matrix with the output layer.
        lowercase: Add a lower-casing normalizer (the vocabulary and decoding are lower-case).
        tags: Tag names whose ``<tag>`` and ``</tag>`` are one token each (after the words):
            decoding joins tokens with spaces, so a model whose tags split into ``<``, ``tag``,
            ``>`` pieces writes ``< tag >``, which no parser reads as a tag.

    Raises:
        ValueError: a word that is not a single pre-tokenizer piece, a tag that is no bare
            name, or a bad size.

    Example:
        >>> import tempfile
        >>> p = build_tiny_lm(tempfile.mkdtemp(), ["go", "up"], arch="gpt2", chat_template=None)
        >>> sorted(f.name for f in p.iterdir())  # doctest: +NORMALIZE_WHITESPACE
        ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json',
         'tokenizer_config.json']
    """
    import torch
    import transformers
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    if arch not in ("llama", "gpt2"):
        raise ValueError(f"arch must be 'llama' or 'gpt2', got {arch!r}")
    for name, value in dict(hidden=hidden, layers=layers, heads=heads, context=context).items():
        check_int(name, value, 1)
    if hidden % heads:
        raise ValueError(
            f"hidden ({hidden}) must be a multiple of heads ({heads}): "
            f"pass e.g. hidden={heads * 16}"
        )
    pre = pre_tokenizers.Whitespace()
    vocab: dict[str, int] = {}
    extra = template_words(chat_template) if chat_template else []
    if lowercase:
        words = [w.lower() for w in words]
    for word in [*SPECIAL_TOKENS, *words, *extra]:
        if word in vocab:
            continue
        if word not in SPECIAL_TOKENS and [p for p, _ in pre.pre_tokenize_str(word)] != [word]:
            raise ValueError(
                f"vocabulary word {word!r} is not a single pre-tokenizer piece (it splits into "
                f"{[p for p, _ in pre.pre_tokenize_str(word)]}): build the list with "
                "words_from_texts(texts)"
            )
        vocab[word] = len(vocab)

    marks = tag_tokens(tags)
    for mark in marks:
        vocab.setdefault(mark, len(vocab))
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre
    # Matched before the pre-tokenizer splits the text (their ids are the vocabulary's above).
    raw.add_tokens([AddedToken(m, normalized=False) for m in marks])
    if lowercase:
        from tokenizers import normalizers

        raw.normalizer = normalizers.Lowercase()
    pad, unk, bos, eos = SPECIAL_TOKENS
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        pad_token=pad,
        unk_token=unk,
        bos_token=bos,
        eos_token=eos,
        model_max_length=context,
        # No "clean up" of " ." into ".": decoding is exactly the tokens joined by spaces.
        clean_up_tokenization_spaces=False,
    )
    if chat_template:
        tokenizer.chat_template = chat_template

    common: dict[str, Any] = {
        "vocab_size": len(vocab),
        "tie_word_embeddings": tie_embeddings,
        "initializer_range": init_range,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }
    config, cls = _model_config(arch, hidden, layers, heads, context, common)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _model_config(
    arch: str, hidden: int, layers: int, heads: int, context: int, common: dict[str, Any]
) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    """The ``transformers`` config and model class of ``arch``."""
    import transformers

    if arch == "gpt2":
        gpt2 = transformers.GPT2Config(
            n_positions=context, n_embd=hidden, n_layer=layers, n_head=heads, **common
        )
        return gpt2, transformers.GPT2LMHeadModel
    llama = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=context,
        **common,
    )
    return llama, transformers.LlamaForCausalLM

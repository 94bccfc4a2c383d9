"""A real (tiny) Hugging Face causal LM behind the mock server, with vLLM's sampling semantics.

Each step samples as vLLM does (:mod:`mock_server.sampling`) from a seeded generator,
and an answer ends as vLLM's does. ``logprobs_mode`` is vLLM's ``--logprobs-mode``:
``"raw_logprobs"`` (the model's ``log_softmax``) or ``"processed_logprobs"`` (those sampled from).

Example:
    >>> import tempfile
    >>> from agent_memory.models import build_tiny_lm
    >>> from mock_server.backends import RequestSampling
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["go", "up", "down"])
    >>> backend = ModelBackend(path)
    >>> backend.logprobs_mode
    'raw_logprobs'
    >>> ids = tuple(backend.encode("go up"))
    >>> request = GenerationRequest(ids, "go up", RequestSampling(max_tokens=5, seed=3))
    >>> out = backend.generate(request)
    >>> len(out.token_ids) == len(out.logprobs) <= 5, backend.generate(request) == out
    (True, True)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mock_server.backends import (
    BackendAnswer,
    ChatMessage,
    FinishReason,
    GenerationRequest,
    RequestSampling,
    check_stop_strings,
)
from mock_server.sampling import (
    GREEDY_EPS,
    apply_penalties,
    effective_temperature,
    load_generation_config,
    processed_logprobs,
)

if TYPE_CHECKING:
    import torch

__all__ = ["GREEDY_EPS", "LogprobsMode", "ModelBackend", "processed_logprobs"]

LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]


class ModelBackend:
    """A Hugging Face causal LM loaded offline from ``path``; one request at a time, ``seed``
    seeds requests without one.

    Attributes:
        generation_config_fields: the non-default ``generation_config.json`` fields (vLLM's read).
        eos_token_id: the tokenizer's EOS; the generation config's other EOS ids are stop tokens.

    Example:
        >>> import tempfile
        >>> from agent_memory.models import build_tiny_lm
        >>> b = ModelBackend(build_tiny_lm(tempfile.mkdtemp(), ["hi"]), model_name="tiny")
        >>> b.model_name, b.context_length, b.eos_token_id, b.token_text(b.eos_token_id)
        ('tiny', 256, 3, '</s>')
    """

    blocking = True

    def __init__(
        self,
        path: str | Path,
        device: str = "cpu",
        *,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        model_name: str | None = None,
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
            raise ValueError(
                "logprobs_mode must be 'processed_logprobs' or 'raw_logprobs', "
                f"got {logprobs_mode!r}"
            )
        self.path = path = Path(path)
        self.device = torch.device(device)
        self.logprobs_mode: LogprobsMode = logprobs_mode
        # Any: transformers' stubs get .to(device) and decode()'s return type wrong.
        tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.tokenizer: Any = tokenizer
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32
        )
        self.model: Any = loaded.to(self.device)
        self.model.eval()
        config = self.model.config
        self.model_name = model_name or path.name
        self.context_length = int(
            getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None)
            or self.tokenizer.model_max_length
        )
        self.vocab_size: int | None = int(config.vocab_size)
        self.generation_config_fields: dict[str, Any] = load_generation_config(path, config)
        # vLLM: the tokenizer's EOS ends answers (stop_reason None); the generation config's
        # other EOS ids are added to stop_token_ids unless ignore_eos (stop_reason: the id).
        listed = self.generation_config_fields.get("eos_token_id")
        listed = [] if listed is None else (listed if isinstance(listed, list) else [listed])
        eos = self.tokenizer.eos_token_id
        if eos is None:
            eos = listed[0] if listed else self.model.generation_config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
        self.eos_token_id = int(eos)
        self._extra_stop_ids = frozenset(int(e) for e in listed) - {self.eos_token_id}
        self._tokens: list[str] = [
            tokenizer.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)
        ]
        self._lock = threading.Lock()
        self._rng = torch.Generator(device="cpu").manual_seed(seed)

    def __repr__(self) -> str:
        return f"ModelBackend({str(self.path)!r}, logprobs_mode={self.logprobs_mode!r})"

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt (special tokens added as the tokenizer does)."""
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token as text (special tokens included)."""
        if 0 <= token_id < len(self._tokens):
            return self._tokens[token_id]
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def render_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Any] | None = None
    ) -> str:
        """The tokenizer's chat template with the generation prompt (and ``tools``)."""
        if not self.tokenizer.chat_template:
            raise ValueError(
                f"the model at {self.path} has no chat template: use /v1/completions, or "
                "rebuild it with build_tiny_lm(..., chat_template=DEFAULT_TEMPLATE)"
            )
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
            **({} if tools is None else {"tools": list(tools)}),
        )

    def generate(self, request: GenerationRequest) -> BackendAnswer:
        """Sample up to ``max_tokens`` tokens; see the module docstring for the semantics."""
        import torch

        p = request.params
        stop_ids = set(p.stop_token_ids) | (set() if p.ignore_eos else self._extra_stop_ids)
        answer = _Answer()
        with self._lock, torch.inference_mode():
            rng = self._rng
            if p.seed is not None:
                rng = torch.Generator(device="cpu").manual_seed(p.seed)
            for token, reported in self._sample(request, rng):
                answer.add(token, reported, p.top_logprobs)
                if self._ends(answer, token, p, stop_ids):
                    break
            if not p.stop:
                answer.text = self.decode(answer.shown)
            elif answer.cut is not None:
                answer.text = answer.text[: answer.cut]
        return BackendAnswer(
            token_ids=tuple(answer.ids),
            logprobs=tuple(answer.logprobs),
            top_logprobs=tuple(answer.tops),
            text=answer.text,
            finish_reason=answer.finish,
            stop_reason=answer.stop_reason,
        )

    def _sample(
        self, request: GenerationRequest, rng: torch.Generator
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Each sampled token with the log-probs reported for its step (``logprobs_mode``),
        for up to ``max_tokens`` steps, one forward pass over the KV cache each."""
        import torch

        from agent_memory.policies.local_model import cache_keyword, returned_cache

        p = request.params
        cache_arg = cache_keyword(self.model)
        temperature = effective_temperature(p.temperature)
        greedy = temperature < GREEDY_EPS
        penalised = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
        step_input = torch.tensor([request.prompt_ids], device=self.device)
        past = None
        prompt_mask = counts = None
        for _ in range(p.max_tokens):
            out = self.model(input_ids=step_input, use_cache=True, **{cache_arg: past})
            past = returned_cache(out)
            logits = out.logits[0, -1].float().cpu()
            if penalised and prompt_mask is None:
                vocab = logits.shape[-1]
                prompt_ids = torch.tensor(request.prompt_ids, dtype=torch.long)
                prompt_mask = torch.bincount(prompt_ids, minlength=vocab + 1)[:vocab] > 0
                counts = torch.zeros(vocab, dtype=torch.long)
            x = apply_penalties(
                logits,
                prompt_mask,
                counts,
                repetition_penalty=p.repetition_penalty,
                presence_penalty=p.presence_penalty,
                frequency_penalty=p.frequency_penalty,
            )
            processed = processed_logprobs(x, temperature, p.top_k, p.top_p, p.min_p)
            if greedy:
                token = int(torch.argmax(x))
            else:
                token = int(torch.multinomial(processed.exp(), 1, generator=rng))
            raw = self.logprobs_mode != "processed_logprobs"
            yield token, torch.log_softmax(logits, dim=-1) if raw else processed
            if counts is not None:
                counts[token] += 1
            step_input = torch.tensor([[token]], device=self.device)

    def _ends(self, answer: _Answer, token: int, p: RequestSampling, stop_ids: set[int]) -> bool:
        """Whether ``token`` (just added) ends ``answer``, in vLLM's order: EOS, stop token ids,
        length, then stop strings on the new text."""
        ids = answer.ids
        done, answer.shown = True, ids
        if token == self.eos_token_id and not p.ignore_eos:
            answer.finish = "stop"
            answer.shown = ids if p.include_stop_str_in_output else ids[:-1]
        elif token in stop_ids:
            answer.finish, answer.stop_reason = "stop", token
            answer.shown = ids if p.include_stop_str_in_output else ids[:-1]
        else:
            done = len(ids) >= p.max_tokens
        if p.stop:
            before, answer.text = answer.text, self.decode(answer.shown)
            new_chars = max(len(answer.text) - len(before), 0)
            found = check_stop_strings(answer.text, new_chars, p.stop, p.include_stop_str_in_output)
            if found is not None:
                answer.finish, answer.stop_reason = "stop", found[0]
                answer.cut = None if found[1] == -1 else found[1]
                return True
        return done


@dataclass
class _Answer:
    """An answer being sampled: its tokens so far, the ids its text shows, how it ended."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish: FinishReason = "length"
    stop_reason: str | int | None = None
    text: str = ""
    cut: int | None = None
    shown: list[int] = field(default_factory=list)

    def add(self, token: int, reported: torch.Tensor, top_logprobs: int) -> None:
        """Record ``token`` with its reported log-prob (and the top ones when asked)."""
        import torch

        self.ids.append(token)
        self.logprobs.append(float(reported[token]))
        if top_logprobs:
            values, indices = torch.topk(reported, min(top_logprobs, reported.numel()))
            self.tops.append(tuple(zip(indices.tolist(), values.tolist(), strict=True)))
        else:
            self.tops.append(())

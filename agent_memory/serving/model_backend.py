"""A real (tiny) Hugging Face causal LM behind the mock server, with vLLM's sampling semantics.

Per step, as vLLM 0.32 does it (:mod:`agent_memory.serving.sampling` has the details and the
vLLM files): float32 logits -> penalties (repetition over prompt + output, frequency and presence
over the output) -> greedy ``argmax`` when ``temperature`` is 0, else ``/ temperature`` ->
``min_p`` -> top-k -> top-p -> sample (seeded ``torch.Generator``). The answer ends as vLLM's
does: EOS (the tokenizer's), a stop token id (the request's ``stop_token_ids`` and the extra EOS
ids of the model's ``generation_config.json``: ``stop_reason`` is the id), ``max_tokens``, or a
stop string (``stop_reason`` is the string; the text is cut before it, or after it with
``include_stop_str_in_output``; the ids keep the token that completed it).

Which log-probs are reported (``logprobs_mode``, vLLM's ``--logprobs-mode``):

* ``"raw_logprobs"`` (default, as in vLLM): ``log_softmax(logits)`` of the model, before any
  processing.
* ``"processed_logprobs"``: the log-probability of each sampled token UNDER THE DISTRIBUTION IT
  WAS SAMPLED FROM (after penalties, temperature, min-p, top-k, top-p; tokens filtered out are
  ``-inf``), what an importance-sampling correction needs. For greedy requests it is
  ``log_softmax`` of the penalised logits.

:func:`~agent_memory.serving.sampling.processed_logprobs` is the processing itself, and
:func:`~agent_memory.serving.sampling.teacher_forced_logprobs` recomputes every reported value
from one forward pass over ``prompt + response``.

Example:
    >>> import tempfile
    >>> from agent_memory.models import build_tiny_lm
    >>> from agent_memory.serving.backends import RequestSampling
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from agent_memory.serving.backends import (
    BackendAnswer,
    ChatMessage,
    GenerationRequest,
    check_stop_strings,
)
from agent_memory.serving.sampling import (
    GREEDY_EPS,
    apply_penalties,
    effective_temperature,
    load_generation_config,
    processed_logprobs,
)

__all__ = ["GREEDY_EPS", "LogprobsMode", "ModelBackend", "processed_logprobs"]

LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]


class ModelBackend:
    """A Hugging Face causal LM (e.g. from :func:`~agent_memory.models.tiny.build_tiny_lm`).

    One request at a time (a lock around the model: requests are tiny, and the server runs
    this backend in one worker thread anyway); a KV cache makes each step one token.

    Args:
        path: A ``save_pretrained`` directory with model and tokenizer (loaded offline).
        device: Torch device.
        logprobs_mode: ``"raw_logprobs"`` (default, as vLLM's; the model's own softmax) or
            ``"processed_logprobs"`` (the sampling distribution); see the module docstring.
        model_name: Served model name; default the directory name.
        seed: Seed of the RNG used by requests that send no ``seed``.

    Attributes:
        generation_config_fields: The non-default fields of the model's generation config
            (``generation_config.json``), as vLLM reads them; the server takes its default
            sampling parameters from them (``MockOpenAIServer(generation_config="auto")``).
        eos_token_id: The tokenizer's EOS (vLLM's); the generation config's other EOS ids end
            answers as stop tokens.

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
        path = Path(path)
        self.path = path
        self.device = torch.device(device)
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model: Any = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=torch.float32
        ).to(self.device)
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
        self._tokens = [
            self.tokenizer.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)
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

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        """The tokenizer's chat template with the generation prompt."""
        if not self.tokenizer.chat_template:
            raise ValueError(
                f"the model at {self.path} has no chat template: use /v1/completions, or "
                "rebuild it with build_tiny_lm(..., chat_template=DEFAULT_TEMPLATE)"
            )
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )

    def generate(self, request: GenerationRequest) -> BackendAnswer:
        """Sample up to ``max_tokens`` tokens; see the module docstring for the semantics."""
        import torch

        from agent_memory.policies.local_model import cache_keyword, returned_cache

        cache_arg = cache_keyword(self.model)
        p = request.params
        temperature = effective_temperature(p.temperature)
        greedy = temperature < GREEDY_EPS
        penalties = {
            "repetition_penalty": p.repetition_penalty,
            "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty,
        }
        penalised = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
        stop_ids = set(p.stop_token_ids) | (set() if p.ignore_eos else self._extra_stop_ids)
        with self._lock, torch.inference_mode():
            rng = self._rng
            if p.seed is not None:
                rng = torch.Generator(device="cpu").manual_seed(p.seed)
            ids: list[int] = []
            logprobs: list[float] = []
            tops: list[tuple[tuple[int, float], ...]] = []
            finish: str = "length"
            stop_reason: str | int | None = None
            text, cut = "", None
            step_input = torch.tensor([request.prompt_ids], device=self.device)
            past = None
            prompt_mask = counts = None
            shown: list[int] = []
            for _ in range(p.max_tokens):
                out = self.model(input_ids=step_input, use_cache=True, **{cache_arg: past})
                past = returned_cache(out)
                logits = out.logits[0, -1].float().cpu()
                if penalised and prompt_mask is None:
                    vocab = logits.shape[-1]
                    prompt_ids = torch.tensor(request.prompt_ids, dtype=torch.long)
                    prompt_mask = torch.bincount(prompt_ids, minlength=vocab + 1)[:vocab] > 0
                    counts = torch.zeros(vocab, dtype=torch.long)
                x = apply_penalties(logits, prompt_mask, counts, **penalties)
                processed = processed_logprobs(x, temperature, p.top_k, p.top_p, p.min_p)
                if greedy:
                    token = int(torch.argmax(x))
                else:
                    token = int(torch.multinomial(processed.exp(), 1, generator=rng))
                reported = (
                    processed
                    if self.logprobs_mode == "processed_logprobs"
                    else torch.log_softmax(logits, dim=-1)
                )
                ids.append(token)
                logprobs.append(float(reported[token]))
                if p.top_logprobs:
                    values, indices = torch.topk(reported, min(p.top_logprobs, reported.numel()))
                    tops.append(tuple(zip(indices.tolist(), values.tolist(), strict=True)))
                else:
                    tops.append(())
                if counts is not None:
                    counts[token] += 1
                # vLLM's order: EOS, stop token ids, length (engine core), then stop strings on
                # the new text (detokenizer; a stop token's text only when it is included).
                done, shown = True, ids
                if token == self.eos_token_id and not p.ignore_eos:
                    finish = "stop"
                    shown = ids if p.include_stop_str_in_output else ids[:-1]
                elif token in stop_ids:
                    finish, stop_reason = "stop", token
                    shown = ids if p.include_stop_str_in_output else ids[:-1]
                else:
                    done = len(ids) >= p.max_tokens
                if p.stop:
                    before, text = text, self.decode(shown)
                    new_chars = max(len(text) - len(before), 0)
                    found = check_stop_strings(
                        text, new_chars, p.stop, p.include_stop_str_in_output
                    )
                    if found is not None:
                        finish, stop_reason = "stop", found[0]
                        cut = None if found[1] == -1 else found[1]
                        break
                if done:
                    break
                step_input = torch.tensor([[token]], device=self.device)
            if not p.stop:
                text = self.decode(shown)
            elif cut is not None:
                text = text[:cut]
        return BackendAnswer(
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            top_logprobs=tuple(tops),
            text=text,
            finish_reason=finish,  # type: ignore[arg-type]
            stop_reason=stop_reason,
        )

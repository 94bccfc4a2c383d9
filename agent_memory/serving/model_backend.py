"""A real (tiny) Hugging Face causal LM behind the mock server, with vLLM's sampling semantics.

Per step: logits (float32) -> divide by ``temperature`` -> keep the ``top_k`` largest -> keep the
smallest most-likely set with mass >= ``top_p`` -> renormalise -> sample (seeded
``torch.Generator``). Greedy when ``temperature`` < 1e-5 (top-k/top-p then play no part, as in
vLLM).

Which log-probs are reported (``logprobs_mode``):

* ``"processed_logprobs"`` (default): the log-probability of each sampled token UNDER THE
  DISTRIBUTION IT WAS SAMPLED FROM (after temperature, top-k, top-p renormalisation; tokens
  filtered out are ``-inf``). This is vLLM's ``--logprobs-mode processed_logprobs``, what an
  importance-sampling correction needs. For greedy requests it is ``log_softmax(logits)``.
* ``"raw_logprobs"``: ``log_softmax(logits)`` of the model, before any processing: vLLM's default.

:func:`processed_logprobs` is the processing itself, vectorised over leading dimensions, so a
teacher-forced forward pass over ``prompt + response`` can recompute every reported value.

Example:
    >>> import tempfile
    >>> from agent_memory.models import build_tiny_lm
    >>> from agent_memory.serving.backends import RequestSampling
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["go", "up", "down"])
    >>> backend = ModelBackend(path)
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
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.serving.backends import (
    BackendAnswer,
    ChatMessage,
    GenerationRequest,
    find_stop,
)

if TYPE_CHECKING:
    import torch

__all__ = ["GREEDY_EPS", "LogprobsMode", "ModelBackend", "processed_logprobs"]

LogprobsMode = Literal["processed_logprobs", "raw_logprobs"]

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5


def processed_logprobs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of the distribution sampled from, over the last dimension.

    ``temperature < GREEDY_EPS`` (greedy): ``log_softmax(logits)``. Otherwise
    ``logits / temperature``, then top-k (``top_k`` > 0: tokens below the k-th largest value get
    ``-inf``; ties at the k-th value are kept), then top-p (``top_p`` < 1: a token is kept when
    the probability mass of the tokens ranked above it is < ``top_p``, so the most likely token
    always stays), then ``log_softmax``.

    Args:
        logits: ``[..., vocab]`` float tensor.
        temperature: >= 0.
        top_k: 0 or -1 = off.
        top_p: In (0, 1]; 1 = off.

    Returns:
        ``[..., vocab]`` float32 log-probabilities (``-inf`` for filtered tokens).

    Example:
        >>> import torch
        >>> lp = processed_logprobs(torch.tensor([2.0, 1.0, 0.0, -1.0]), 1.0, top_k=2)
        >>> [round(v, 4) for v in lp.exp().tolist()]
        [0.7311, 0.2689, 0.0, 0.0]
        >>> processed_logprobs(torch.tensor([2.0, 1.0, 0.0]), 0.5, top_p=0.5).exp().tolist()
        [1.0, 0.0, 0.0]
    """
    import torch

    x = logits.float()
    if temperature < GREEDY_EPS:
        return torch.log_softmax(x, dim=-1)
    x = x / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


class ModelBackend:
    """A Hugging Face causal LM (e.g. from :func:`~agent_memory.models.tiny.build_tiny_lm`).

    One request at a time (a lock around the model: requests are tiny, and the server runs
    this backend in one worker thread anyway); a KV cache makes each step one token.

    Args:
        path: A ``save_pretrained`` directory with model and tokenizer (loaded offline).
        device: Torch device.
        logprobs_mode: ``"processed_logprobs"`` (default; the sampling distribution) or
            ``"raw_logprobs"`` (the model's own softmax); see the module docstring.
        model_name: Served model name; default the directory name.
        seed: Seed of the RNG used by requests that send no ``seed``.

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
        logprobs_mode: LogprobsMode = "processed_logprobs",
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
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self._eos = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        self.eos_token_id = int(eos[0] if isinstance(eos, list) else eos)
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

        p = request.params
        with self._lock, torch.inference_mode():
            rng = self._rng
            if p.seed is not None:
                rng = torch.Generator(device="cpu").manual_seed(p.seed)
            ids: list[int] = []
            logprobs: list[float] = []
            tops: list[tuple[tuple[int, float], ...]] = []
            text: str | None = None
            finish, stop_reason = "length", None
            step_input = torch.tensor([request.prompt_ids], device=self.device)
            past = None
            for _ in range(p.max_tokens):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float().cpu()
                processed = processed_logprobs(logits, p.temperature, p.top_k, p.top_p)
                if p.temperature < GREEDY_EPS:
                    token = int(torch.argmax(processed))
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
                if token in self._eos and not p.ignore_eos:
                    finish = "stop"
                    break
                if p.stop:
                    decoded = self.decode(ids)
                    found = find_stop(decoded, p.stop)
                    if found is not None:
                        text, finish, stop_reason = decoded[: found[0]], "stop", found[1]
                        break
                step_input = torch.tensor([[token]], device=self.device)
        return BackendAnswer(
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            top_logprobs=tuple(tops),
            text=self.decode(ids) if text is None else text,
            finish_reason=finish,  # type: ignore[arg-type]
            stop_reason=stop_reason,
        )

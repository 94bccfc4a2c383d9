"""``score``: a local causal LM that chooses among the admissible actions by their likelihood.

GLAM-style (Carta et al., 2023): each admissible action ``a`` scores the log-likelihood of the
response that takes it (``parser.format(a)`` then EOS), and the policy samples from
``softmax(score / temperature)`` (0: the best). Each generation records an
:class:`~agent_memory.protocol.ActionChoice` a trainer rescores with :func:`score_candidates`.
With a memory that offers blocks to write (``meta["memory_candidates"]``, ``memory=notes``) it
also chooses one the same way, from the same prompt: the response is that block, then the action.
A block's score is by default its *mean* token log-prob (``memory_score``): blocks differ in
length by whole lines, and by the summed log-likelihood the empty block always wins, so the choice
RL should train is never explored.

Example:
    >>> import tempfile
    >>> from agent_memory.models import build_tiny_lm
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["go", "up", "down"])
    >>> policy = ScoringPolicy(path, temperature=0.0)
    >>> [g] = policy.generate(["go"], [{"admissible_actions": ["up", "down"]}])
    >>> g.text in ("<action>up</action>", "<action>down</action>"), len(g.choice.candidate_ids)
    (True, 2)
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from agent_memory.checks import check_choice, check_int, check_number
from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Policy, Prompt, check_batch
from agent_memory.policies.hf import GenerationStats, HFPolicy
from agent_memory.policies.local_model import cache_keyword, context_length, returned_cache
from agent_memory.policies.settings import ScoringSettings
from agent_memory.protocol import (
    SCORE_RULES,
    ActionChoice,
    Generation,
    SamplingParams,
    ScoreRule,
)

if TYPE_CHECKING:
    import os

    import torch

__all__ = ["CandidateScores", "ScoringPolicy", "score_candidates"]

log = logging.getLogger(__name__)

#: One choice: the chosen index, the prompt ids, every candidate's ids, the chosen one's token
#: log-probs (None when it was the only one), and its log-prob under the softmax.
_Chosen = tuple[int, list[int], list[list[int]], list[float] | None, float]


class CandidateScores:
    """What :func:`score_candidates` computes for a batch of prompts.

    Attributes:
        token_logprobs: ``(B, K, L)`` log-probability of each candidate token (0 on padding).
        scores: ``(B, K)`` each candidate's score: its token log-probs' sum or mean, as asked
            (``-inf`` where absent).
        prompt_hidden: ``(B, H)`` the last hidden state at each prompt's last token, or None.
    """

    def __init__(
        self, token_logprobs: torch.Tensor, scores: torch.Tensor, prompt_hidden: Any = None
    ) -> None:
        self.token_logprobs = token_logprobs
        self.scores = scores
        self.prompt_hidden = prompt_hidden

    def action_logprobs(self, temperature: float) -> torch.Tensor:
        """``(B, K)`` log-softmax of ``scores / temperature`` (``-inf`` for absent candidates);
        ``temperature=0`` gives the log-softmax of the raw scores (as greedy sampling records)."""
        t = temperature if temperature > 0 else 1.0
        return (self.scores / t).log_softmax(-1)


def score_candidates(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    candidate_ids: Sequence[Sequence[Sequence[int]]],
    *,
    pad_id: int,
    with_hidden: bool = False,
    score: ScoreRule | Sequence[ScoreRule] = "sum",
) -> CandidateScores:
    """Each candidate response's token log-probabilities given its prompt (teacher forcing).

    One forward pass over the (left-padded) prompts, then one over every candidate on its
    prompt's key/value cache. Gradients flow outside ``torch.no_grad``: the trainer recomputes
    what :class:`ScoringPolicy` sampled with.

    Args:
        model: a ``transformers`` causal LM.
        prompt_ids: per prompt, its token ids (non-empty).
        candidate_ids: per prompt, its candidates' token ids (each non-empty; at least one).
        pad_id: the id used for padding (masked out).
        with_hidden: also return the last layer's hidden state at each prompt's last token.
        score: how a candidate's score is made from its token log-probs (``sum`` or ``mean``),
            for every prompt or one rule per prompt.

    Example:
        >>> import tempfile, torch, transformers
        >>> from agent_memory.models import build_tiny_lm
        >>> path = build_tiny_lm(tempfile.mkdtemp(), ["a", "b"])
        >>> lm = transformers.AutoModelForCausalLM.from_pretrained(path)
        >>> out = score_candidates(lm, [[4, 5]], [[[4], [5, 3]]], pad_id=0)
        >>> with torch.no_grad():
        ...     full = lm(torch.tensor([[4, 5, 5, 3]])).logits.log_softmax(-1)
        >>> expected = full[0, 1, 5] + full[0, 2, 3]
        >>> bool(torch.isclose(out.scores[0, 1], expected, atol=1e-5))
        True
        >>> mean = score_candidates(lm, [[4, 5]], [[[4], [5, 3]]], pad_id=0, score="mean")
        >>> bool(torch.isclose(mean.scores[0, 1], expected / 2, atol=1e-5))
        True
    """
    import torch

    if len(prompt_ids) != len(candidate_ids):
        raise ValueError(f"got {len(prompt_ids)} prompts but {len(candidate_ids)} candidate lists")
    if any(not p for p in prompt_ids) or any(not cs or not all(cs) for cs in candidate_ids):
        raise ValueError("every prompt and every candidate needs at least one token")
    rules = [score] * len(prompt_ids) if isinstance(score, str) else list(score)
    if len(rules) != len(prompt_ids):
        raise ValueError(f"got {len(prompt_ids)} prompts but {len(rules)} score rules")
    for rule in set(rules):
        check_choice("score", rule, SCORE_RULES)
    device = next(model.parameters()).device
    b = len(prompt_ids)
    inputs, mask = _padded(prompt_ids, pad_id, device, left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=inputs,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        output_hidden_states=with_hidden,
    )
    first = out.logits[:, -1].float().log_softmax(-1)  # the first response token's distribution
    hidden = out.hidden_states[-1][:, -1] if with_hidden else None

    rows = [(i, k) for i, cs in enumerate(candidate_ids) for k in range(len(cs))]
    k_max = max(len(cs) for cs in candidate_ids)
    cands, cmask = _padded([candidate_ids[i][k] for i, k in rows], pad_id, device, left=False)
    length = cands.shape[1]
    owner = torch.tensor([i for i, _ in rows], dtype=torch.long, device=device)
    logps = first[owner].gather(-1, cands[:, :1])  # (R, 1)
    if length > 1:
        # The later tokens of every candidate, on its prompt's cache.
        cache = _select_cache(returned_cache(out), owner)
        tail_mask = torch.cat([mask[owner], cmask[:, :-1]], dim=1)
        tail_pos = positions[owner, -1:] + 1 + torch.arange(length - 1, device=device)
        tail = model(
            input_ids=cands[:, :-1],
            attention_mask=tail_mask,
            position_ids=tail_pos,
            use_cache=True,
            **{cache_keyword(model): cache},
        )
        later = tail.logits.float().log_softmax(-1).gather(-1, cands[:, 1:, None]).squeeze(-1)
        logps = torch.cat([logps, later], dim=1)
    logps = logps * cmask  # padding contributes nothing
    token_logprobs = logps.new_zeros((b, k_max, length))
    scores = logps.new_full((b, k_max), -math.inf)
    idx_k = torch.tensor([k for _, k in rows], device=device)
    token_logprobs = token_logprobs.index_put((owner, idx_k), logps)
    # A mean divides by the candidate's own length (its real tokens, not the padding).
    mean = torch.tensor([rules[i] == "mean" for i, _ in rows], device=device)
    sums = logps.sum(-1)
    scores = scores.index_put((owner, idx_k), torch.where(mean, sums / cmask.sum(-1), sums))
    return CandidateScores(token_logprobs, scores, hidden)


def _padded(
    seqs: Sequence[Sequence[int]], pad_id: int, device: Any, *, left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``seqs`` padded to one width with ``pad_id`` (on the left or right), and their mask."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, cols] = torch.tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids.to(device), mask.to(device)


def _admissible(i: int, meta: Mapping[str, Any]) -> list[Any]:
    """Prompt ``i``'s admissible actions from its ``meta``.

    Raises:
        ValueError: none listed (the score policy chooses among them).
    """
    options = meta.get("admissible_actions")
    if not options:
        raise ValueError(
            f"prompt {i} has no admissible actions to score ({options!r}): the score policy "
            "needs envs that list them (info['admissible_actions']); use policy=hf to generate "
            "free text instead"
        )
    return list(options)


def _select_cache(cache: Any, index: torch.Tensor) -> Any:
    """The key/value cache of rows ``index`` (a row may repeat): a new cache, the old one kept."""
    import copy

    if isinstance(cache, tuple):  # the legacy format: per layer (keys, values)
        return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    selected.reorder_cache(index)
    return selected


class _Loader(HFPolicy):
    """The hf policy as the score policy uses it: to load a model and render prompts, never to
    ``generate``, so the model's generation config shapes nothing it samples."""

    def check_generation_config(self) -> None:
        """Nothing to check: no ``generate`` call."""


class ScoringPolicy(Policy):
    """Chooses among the admissible actions by the model's likelihood of each (module docstring).

    Takes a model as the ``hf`` policy does. ``temperature`` is the action softmax's (0: the
    best). With ``seed`` each episode step draws from its own stream, whatever its batch.
    ``append_eos`` ends each candidate with the end token; ``score_forced`` also scores
    single-candidate steps (else a forced action needs no forward pass). ``action_score`` and
    ``memory_score`` make each candidate's score from its token log-probs (``sum`` or ``mean``).
    """

    settings_class = ScoringSettings

    temperature: float

    needs = frozenset({"admissible_actions", "memory_candidates"})

    def __init__(
        self,
        path: str | os.PathLike[str] | None = ScoringSettings.path,
        *,
        model: Any = None,
        tokenizer: Any = None,
        temperature: float = ScoringSettings.temperature,
        batch_size: int = ScoringSettings.batch_size,
        device: str = ScoringSettings.device,
        dtype: Literal["auto", "float32", "float16", "bfloat16"] = ScoringSettings.dtype,
        seed: int | None = ScoringSettings.seed,
        use_chat_template: bool | Literal["auto"] = ScoringSettings.use_chat_template,
        num_threads: int | None = ScoringSettings.num_threads,
        append_eos: bool = ScoringSettings.append_eos,
        score_forced: bool = ScoringSettings.score_forced,
        parser: ActionParser | None = None,
        action_score: ScoreRule = ScoringSettings.action_score,
        memory_score: ScoreRule = ScoringSettings.memory_score,
    ) -> None:
        super().__init__(parser)
        check_number("temperature", temperature, low=0)
        check_int("batch_size", batch_size, 1)
        check_int("seed", seed, 0, allow_none=True)
        check_choice("action_score", action_score, SCORE_RULES)
        check_choice("memory_score", memory_score, SCORE_RULES)
        # The hf policy loads the model, adopts a live one and renders prompts the same way.
        self._lm = _Loader(
            path,
            model=model,
            tokenizer=tokenizer,
            max_new_tokens=1,
            temperature=0.0,
            device=device,
            dtype=dtype,
            use_chat_template=use_chat_template,
            num_threads=num_threads,
            parser=parser,
        )
        self.temperature = float(temperature)
        self.batch_size = batch_size
        self.seed = seed
        self.append_eos = append_eos
        self.score_forced = score_forced
        self.action_score: ScoreRule = action_score
        self.memory_score: ScoreRule = memory_score
        self.stats = GenerationStats()
        self.last_stats = GenerationStats()
        eos = self._lm._eos
        if append_eos and not eos:
            raise ValueError(
                "append_eos=True needs an end token but the tokenizer has none: pass "
                "append_eos=false"
            )
        self._eos = eos[0] if eos else None
        self._context = context_length(self.model.config)

    @property
    def model(self) -> Any:
        """The ``transformers`` model."""
        return self._lm.model

    @property
    def tokenizer(self) -> Any:
        """Its tokenizer (left padding)."""
        return self._lm.tokenizer

    @property
    def renderer(self) -> Any:
        """The :class:`~agent_memory.policies.rendering.PromptRenderer` of its prompts."""
        return self._lm.renderer

    def candidate_ids(self, action: Any) -> list[int]:
        """The token ids of the response that takes ``action``: ``parser.format(action)``
        tokenized without special tokens, then EOS (with ``append_eos``)."""
        return self.block_ids(self.parser.format(str(action)))

    def sampling_params(self) -> SamplingParams:
        """How this policy samples (temperature of the action softmax; recorded per response)."""
        return SamplingParams(temperature=self.temperature, seed=self.seed)

    def generate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """One :class:`~agent_memory.protocol.Generation` per prompt (see the module docstring).

        Raises:
            ValueError: a prompt without a finite list of admissible actions.
        """
        check_batch(prompts)
        if meta is None or len(meta) != len(prompts):
            raise ValueError(
                "the score policy needs each prompt's admissible actions in meta "
                "(meta[i]['admissible_actions']); the rollout passes them"
            )
        actions = [_admissible(i, m) for i, m in enumerate(meta)]
        rng = np.random.default_rng(None if self.seed is None else [self.seed, self.calls])
        self.calls += 1
        call = GenerationStats(calls=1, prompts=len(prompts))
        cands = [[self.candidate_ids(a) for a in options] for options in actions]
        memories = [m.get("memory_candidates") or None for m in meta]
        blocks = [[self.block_ids(b) for b in m or ()] for m in memories]
        # One prompt for both choices: room for the longest response of either.
        pids = [
            self._prompt_ids(p, i, max([*c, *b], key=len))
            for i, (p, c, b) in enumerate(zip(prompts, cands, blocks, strict=True))
        ]
        chosen = self._choose(pids, meta, cands, rng, 0, call, self.action_score)
        written = self._write(pids, meta, blocks, rng, call)
        self.stats.add(call)
        self.last_stats = call
        return [self._record(actions[i], c, memories[i], written[i]) for i, c in enumerate(chosen)]

    def _write(
        self,
        pids: list[list[int]],
        meta: Sequence[Mapping[str, Any]],
        blocks: list[list[list[int]]],
        rng: np.random.Generator,
        call: GenerationStats,
    ) -> list[_Chosen | None]:
        """The memory block chosen for each prompt that offers some (None for the others)."""
        offered = [i for i, b in enumerate(blocks) if b]
        found = self._choose(
            [pids[i] for i in offered],
            [meta[i] for i in offered],
            [blocks[i] for i in offered],
            rng,
            1,
            call,
            self.memory_score,
        )
        chosen = dict(zip(offered, found, strict=True))
        return [chosen.get(i) for i in range(len(pids))]

    def block_ids(self, block: Any) -> list[int]:
        """The token ids of a memory block written as given, then EOS (with ``append_eos``)."""
        ids = list(self.tokenizer(str(block), add_special_tokens=False)["input_ids"])
        # __init__ refuses append_eos without an end token, so _eos is set when it is on.
        return [*ids, self._eos] if self.append_eos and self._eos is not None else ids

    def _choose(
        self,
        prompt_ids: Sequence[list[int]],
        meta: Sequence[Mapping[str, Any]],
        options: Sequence[list[list[int]]],
        rng: np.random.Generator,
        stream: int,
        call: GenerationStats,
        rule: ScoreRule,
    ) -> list[_Chosen]:
        """Per prompt, one of its ``options`` (response ids) sampled from the softmax of their
        scores (made by ``rule``); ``stream`` separates the draws of several choices."""
        import torch

        out: list[Any] = [None] * len(prompt_ids)
        todo = []
        for i, (pid, opts) in enumerate(zip(prompt_ids, options, strict=True)):
            if len(opts) == 1 and not self.score_forced:
                out[i] = (0, pid, opts, None, 0.0)
            else:
                todo.append(i)
        draws = [self._draw(rng, meta[i], stream) for i in todo]
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            cands = [options[i] for i in chunk]
            pids = [prompt_ids[i] for i in chunk]
            training = self.model.training
            self.model.eval()
            with torch.inference_mode():
                scored = score_candidates(
                    self.model, pids, cands, pad_id=self.tokenizer.pad_token_id, score=rule
                )
                logp = scored.action_logprobs(self.temperature).cpu()
                tokens = scored.token_logprobs.cpu()
            self.model.train(training)
            call.batches += 1
            for row, i in enumerate(chunk):
                n = len(cands[row])
                probs = logp[row, :n].exp().double().numpy()
                if self.temperature == 0:
                    k = int(np.argmax(logp[row, :n].numpy()))
                else:  # inverse CDF of the action distribution
                    k = min(
                        int(np.searchsorted(np.cumsum(probs), draws[start + row] * probs.sum())),
                        n - 1,
                    )
                lps = tokens[row, k, : len(cands[row][k])].tolist()
                out[i] = (k, pids[row], cands[row], lps, float(logp[row, k]))
                call.prompt_tokens += len(pids[row])
                call.completion_tokens += sum(len(c) for c in cands[row])
        return out

    def _draw(self, rng: np.random.Generator, meta: Mapping[str, Any], stream: int = 0) -> float:
        """A uniform draw for one prompt: from ``default_rng([seed, crc32(traj_uid), step])``
        (the memory's choice: ``[..., step, 1]``) when the prompt names its episode and step,
        else from the call's stream."""
        episode, step = meta.get("traj_uid"), meta.get("step")
        if self.seed is None or episode is None or not isinstance(step, int):
            return float(rng.random())
        key = zlib.crc32(str(episode).encode("utf-8", "replace"))
        seeds = [self.seed, key, step] + ([stream] if stream else [])
        return float(np.random.default_rng(seeds).random())

    def _prompt_ids(self, prompt: Prompt, index: int, longest: list[int]) -> list[int]:
        ids = self.renderer.ids(prompt, index)
        if self._context is not None and len(ids) + len(longest) > self._context:
            room = max(1, self._context - len(longest))
            log.warning(
                "score policy: a prompt of %d tokens plus a %d-token action exceeds the model's "
                "context %d: its oldest tokens are dropped",
                len(ids),
                len(longest),
                self._context,
            )
            self.stats.truncated_prompts += 1
            ids = ids[-room:]
        return ids

    def _record(
        self,
        actions: list[Any],
        chosen: _Chosen,
        blocks: Sequence[Any] | None,
        written: _Chosen | None,
    ) -> Generation:
        """The generation of one prompt: its action's choice and, when a block was written,
        the memory's (the text: the block, then the action)."""
        k, prompt_ids, cands, token_logprobs, logprob = chosen
        text = self.parser.format(str(actions[k]))
        memory = None
        if written is not None and blocks is not None:
            text = f"{blocks[written[0]]}{text}"
            memory = self._choice(written[2], written[0], written[4], self.memory_score)
        return Generation(
            text=text,
            prompt_ids=prompt_ids,
            response_ids=list(cands[k]),
            response_logprobs=token_logprobs,
            finish_reason="stop",
            policy_version=self.version,
            sampling=self.sampling_params(),
            choice=self._choice(cands, k, logprob, self.action_score),
            memory_choice=memory,
        )

    def _choice(
        self, cands: list[list[int]], k: int, logprob: float, rule: ScoreRule
    ) -> ActionChoice:
        return ActionChoice(
            candidate_ids=tuple(tuple(c) for c in cands),
            index=k,
            logprob=logprob,
            temperature=self.temperature,
            score=rule,
        )

    def close(self) -> None:
        """Drop the model and tokenizer. Idempotent."""
        self._lm.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(path={str(self._lm.path)!r}, "
            f"temperature={self.temperature}, calls={self.calls})"
        )

"""``hf``: a local Hugging Face causal LM (``transformers`` + ``torch``, extra ``llm``).

The model loads from a ``save_pretrained`` directory or a cached hub id, never downloading.
Prompts are generated in left-padded batches, cut at EOS or a ``stop`` string; each response
records its ids and their log-probs under the distribution they were drawn from, so rows are
trainable. With ``seed``, call ``k`` samples under ``seed + k`` in a forked RNG.

Example:
    >>> from agent_memory.policies import make_policy
    >>> make_policy("hf", path="/no/such/model")
    Traceback (most recent call last):
    ...
    FileNotFoundError: path must be a directory saved by save_pretrained() (config.json,
    weights, tokenizer_config.json) or the id of a hub repo already in the local Hugging Face
    cache, got '/no/such/model' (not a directory, not a cached hub id); nothing is downloaded
"""

from __future__ import annotations

import importlib.util
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.checks import check_choice, check_int, check_number, check_stop, is_number
from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Counters, Policy, Prompt, check_batch
from agent_memory.policies.generation_config import (
    SENT_FIELDS,
    check_generation_config,
    repetition_penalty,
)
from agent_memory.policies.local_model import context_length, resolve_model, torch_device
from agent_memory.policies.offsets import token_offsets
from agent_memory.policies.rendering import PromptRenderer, check_use_chat_template
from agent_memory.policies.settings import HFSettings
from agent_memory.policies.stops import cut_at_stops, stop_criteria
from agent_memory.protocol import Generation, SamplingParams
from agent_memory.tool_actions import policy_tools, prompt_tools, tool_needs, with_tools

if TYPE_CHECKING:
    import os

__all__ = ["GenerationStats", "HFPolicy"]

log = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass
class GenerationStats(Counters):
    """Counters of an :class:`HFPolicy` (cumulative in ``stats``, one call in ``last_stats``).

    Attributes:
        calls, prompts, batches: ``act`` calls; prompts answered; ``generate`` calls.
        prompt_tokens: prompt tokens fed to the model (after truncation, without padding).
        completion_tokens: tokens generated, up to EOS or the stop string's token.
        truncated_prompts: prompts cut to fit the model's context.
        generate_s: seconds spent in ``generate``.
    """

    calls: int = 0
    prompts: int = 0
    batches: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated_prompts: int = 0
    generate_s: float = 0.0


class HFPolicy(Policy):
    """Answers prompts with a local Hugging Face causal LM (see the module docstring).

    Give ``path`` (a model directory or cached hub id), or a loaded ``model`` and its
    ``tokenizer`` (e.g. a trainer's live model). ``temperature=0`` is greedy; ``top_k=0``,
    ``top_p=1``, ``min_p=0`` and ``repetition_penalty=1`` are off. Every sampling field is sent
    from these settings and recorded, whatever the model's ``generation_config.json`` says; a
    model whose generation config sets another field that changes the distribution is refused
    (:func:`~agent_memory.policies.generation_config.check_generation_config`). ``num_threads``
    sets torch's (process-wide) thread count.

    Attributes:
        stats, last_stats: :class:`GenerationStats` since construction and of the last call.
        model, tokenizer: the ``transformers`` objects (None once closed).
    """

    settings_class = HFSettings

    temperature: float

    model: Any
    tokenizer: Any

    def __init__(
        self,
        path: str | os.PathLike[str] | None = HFSettings.path,
        *,
        model: Any = None,
        tokenizer: Any = None,
        max_new_tokens: int = HFSettings.max_new_tokens,
        temperature: float = HFSettings.temperature,
        top_p: float = HFSettings.top_p,
        top_k: int = HFSettings.top_k,
        min_p: float = HFSettings.min_p,
        repetition_penalty: float = HFSettings.repetition_penalty,
        batch_size: int = HFSettings.batch_size,
        device: str = HFSettings.device,
        dtype: Literal["auto", "float32", "float16", "bfloat16"] = HFSettings.dtype,
        seed: int | None = HFSettings.seed,
        use_chat_template: bool | Literal["auto"] = HFSettings.use_chat_template,
        stop: str | Sequence[str] | None = HFSettings.stop,
        num_threads: int | None = HFSettings.num_threads,
        incremental: bool = HFSettings.incremental,
        tools: str | Sequence[Mapping[str, Any]] | None = HFSettings.tools,
        parser: ActionParser | None = None,
    ) -> None:
        super().__init__(parser)
        check_int("max_new_tokens", max_new_tokens, 1)
        check_int("batch_size", batch_size, 1)
        check_int("top_k", top_k, 0)
        check_int("seed", seed, 0, allow_none=True)
        check_int("num_threads", num_threads, 1, allow_none=True)
        check_number("temperature", temperature, low=0)
        if not is_number(top_p) or not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        check_number("min_p", min_p, low=0, high=1)
        check_number("repetition_penalty", repetition_penalty, low=0, low_open=True)
        check_use_chat_template(use_chat_template)
        check_choice("dtype", dtype, _DTYPES)
        stops = check_stop(stop) or []
        _check_source(path, model, tokenizer)
        self.tools = policy_tools(tools)
        if self.tools is not None and incremental:
            raise ValueError(
                "tools are never rendered incrementally: pass policy.params.incremental=false, "
                "or remove policy.params.tools"
            )
        model_dir = None if path is None else resolve_model(path, key="path")
        self.path = model_dir
        self.max_new_tokens = max_new_tokens
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = top_k
        self.min_p = float(min_p)
        self.repetition_penalty = float(repetition_penalty)
        self.batch_size = batch_size
        self.seed = seed
        self.stop: list[str] = stops
        self.stats = GenerationStats()
        self.last_stats = GenerationStats()
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
        if model_dir is not None:
            self._load(model_dir, device, dtype)
        else:
            self._adopt(model, tokenizer)
        self.renderer = PromptRenderer(
            self.tokenizer,
            use_chat_template,
            str(model_dir or "the given tokenizer"),
            incremental=incremental,
        )
        self.use_chat_template = use_chat_template
        if self.tools is not None and not self.renderer.templated:
            raise ValueError(
                "tools are rendered by the chat template: pass policy.params.use_chat_template="
                "auto with a model whose tokenizer has one, or remove policy.params.tools"
            )
        self.needs = tool_needs(self.tools)  # each env's tools and its memory's
        self._context = context_length(self.model.config)
        self.check_generation_config()
        if self._context is not None and self._context <= max_new_tokens:
            raise ValueError(
                f"max_new_tokens must be < the model's context length {self._context} to leave "
                f"room for a prompt, got {max_new_tokens}"
            )

    def _load(self, model_dir: Path, device: str, dtype: str) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch_device(device)
        self._set_tokenizer(
            AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True), str(model_dir)
        )
        # transformers >= 4.56 names the argument dtype; older ones torch_dtype.
        version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
        dtype_arg = "dtype" if version >= (4, 56) else "torch_dtype"
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        # Any: transformers' stubs type PreTrainedModel.to() as taking the model, not a device.
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(model_dir), local_files_only=True, **{dtype_arg: torch_dtype}
        )
        self.model = model
        self.model.to(self.device).eval()
        self._set_eos()

    def _adopt(self, model: Any, tokenizer: Any) -> None:
        """Generate with a loaded model (not moved, not copied) and a copy of its tokenizer."""
        import copy

        self.model = model
        self.device = next(model.parameters()).device
        self._set_tokenizer(copy.copy(tokenizer), "the given tokenizer")
        self._set_eos()

    def _set_tokenizer(self, tokenizer: Any, where: str) -> None:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(
                    f"the tokenizer in {where!r} has neither a pad nor an EOS token: "
                    "set pad_token in its tokenizer_config.json (batches need padding)"
                )
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer

    def _set_eos(self) -> None:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self._eos: list[int] = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def render_prompt(self, prompt: Prompt, index: int = 0) -> str:
        """The text the model gets for ``prompt`` (after the chat template, if one applies).

        Raises:
            ValueError: a message list without a chat template to render it.
        """
        return self.renderer.text(prompt, index)

    def generate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """One :class:`~agent_memory.protocol.Generation` per prompt, in prompt order: the text
        (only the generated part) with the prompt ids, the sampled ids and their log-probs.

        Raises:
            ValueError: a prompt that cannot be rendered (see :meth:`render_prompt`).
            RuntimeError: the policy was closed.
        """
        check_batch(prompts, meta)
        if getattr(self, "model", None) is None:
            raise RuntimeError(f"the hf policy for {str(self.path)!r} is closed")
        episodes = [None] * len(prompts) if meta is None else [m.get("traj_uid") for m in meta]
        tools = [prompt_tools(self.tools, meta, i) for i in range(len(prompts))]
        ids = [
            self.renderer.episode_ids(p, e, i, tools[i])
            for i, (p, e) in enumerate(zip(prompts, episodes, strict=True))
        ]
        if not ids:
            return []
        import torch

        call = GenerationStats(calls=1, prompts=len(ids))
        out: list[Generation | None] = [None] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=self.seed is not None):
            if self.seed is not None:
                torch.manual_seed(self.seed + self.calls)
            self._generate_all(ids, order, out, call)
        self.calls += 1
        self.stats.add(call)
        self.last_stats = call
        done = [g if t is None else with_tools(g, t) for g, t in zip(out, tools, strict=True) if g]
        for prompt, episode, g in zip(prompts, episodes, done, strict=True):
            if episode is not None:
                self.renderer.remember(episode, prompt, g.prompt_ids or [], g.response_ids or [])
        return done

    def close(self) -> None:
        """Drop the model and tokenizer (and free the GPU cache). Idempotent."""
        model = getattr(self, "model", None)
        self.model = self.tokenizer = None
        if model is not None and self.device.type == "cuda":
            import torch

            del model
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(path={str(self.path)!r}, device={str(self.device)!r}, "
            f"temperature={self.temperature}, max_new_tokens={self.max_new_tokens})"
        )

    def _encode(self, prompt: Prompt, index: int) -> list[int]:
        return self.renderer.ids(prompt, index)

    def _generate_all(
        self,
        ids: list[list[int]],
        order: list[int],
        out: list[Generation | None],
        call: GenerationStats,
    ) -> None:
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            generations, truncated, seconds = self._generate([ids[i] for i in chunk])
            for i, g in zip(chunk, generations, strict=True):
                out[i] = g
                call.prompt_tokens += len(g.prompt_ids or ())
                call.completion_tokens += len(g.response_ids or ())
            call.batches += 1
            call.truncated_prompts += truncated
            call.generate_s += seconds

    def _generate(self, batch: list[list[int]]) -> tuple[list[Generation], int, float]:
        import torch

        batch, truncated = self._truncate(batch)
        width = max(len(x) for x in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch])
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch])
        stopper = stop_criteria(self.tokenizer, self.stop, width, len(batch))
        penalty = (
            []
            if self.repetition_penalty == 1.0
            else [repetition_penalty(self.repetition_penalty, [width - len(x) for x in batch])]
        )
        t0 = time.perf_counter()
        training = self.model.training
        self.model.eval()
        with torch.inference_mode():
            generated = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=self._generation_config(),
                logits_processor=penalty or None,
                stopping_criteria=None if stopper is None else [stopper],
                **_own_config_only(self.model),
            )
            # The logits each token was sampled from (after every processor), log-softmaxed.
            scores = torch.stack(generated.scores, dim=1).float().log_softmax(-1)
            new = generated.sequences[:, width:]
            chosen = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        self.model.train(training)
        elapsed = time.perf_counter() - t0
        sampling = self.sampling_params()
        out = [
            self._generation(
                batch[row],
                tokens,
                logps,
                None if stopper is None else stopper.stopped_at[row],
                sampling,
            )
            for row, (tokens, logps) in enumerate(zip(new.tolist(), chosen.tolist(), strict=True))
        ]
        return out, truncated, elapsed

    def _truncate(self, batch: list[list[int]]) -> tuple[list[list[int]], int]:
        """``batch`` with prompts too long for the context cut to their newest tokens, and how
        many were cut."""
        if self._context is None:
            return batch, 0
        room = self._context - self.max_new_tokens
        truncated = sum(len(x) > room for x in batch)
        if not truncated:
            return batch, 0
        log.warning(
            "hf policy: %d prompt(s) longer than the %d tokens the context leaves "
            "(context %d - max_new_tokens %d): their oldest tokens are dropped",
            truncated,
            room,
            self._context,
            self.max_new_tokens,
        )
        return [x[-room:] for x in batch], truncated

    def _generation(
        self,
        prompt: list[int],
        tokens: list[int],
        logps: list[float],
        stop_at: int | None,
        sampling: SamplingParams,
    ) -> Generation:
        """One row's generation: its tokens cut after the first EOS or the stop string's."""
        end = next((j + 1 for j, t in enumerate(tokens) if t in self._eos), None)
        if stop_at is not None and (end is None or stop_at < end):
            end = stop_at
        finish = "length" if end is None else "stop"
        end = len(tokens) if end is None else end
        body = tokens[:end]
        decoded = self.tokenizer.decode(
            [t for t in body if t not in self._eos], skip_special_tokens=True
        )
        text = cut_at_stops(decoded, self.stop)
        return Generation(
            text=text,
            prompt_ids=list(prompt),
            response_ids=body,
            response_logprobs=logps[:end],
            finish_reason=finish,
            policy_version=self.version,
            sampling=sampling,
            response_offsets=self._offsets(body, decoded, len(text)),
        )

    def _offsets(self, body: list[int], decoded: str, length: int) -> list[int] | None:
        """Where each token of ``body`` (which decodes to ``decoded``) starts in the response
        text (its first ``length`` characters: a stop string cuts the text, not the ids)."""
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        offsets = token_offsets(decode, body, decoded, self._eos)
        return None if offsets is None else [min(o, length) for o in offsets]

    def sampling_params(self) -> SamplingParams:
        """How this policy samples (recorded with each response): every field it sends
        ``generate()`` (the repetition penalty shapes greedy decoding too)."""
        greedy = self.temperature == 0
        return SamplingParams(
            temperature=self.temperature,
            top_p=None if greedy else self.top_p,
            top_k=None if greedy else self.top_k,
            max_tokens=self.max_new_tokens,
            seed=self.seed,
            min_p=None if greedy else self.min_p,
            repetition_penalty=self.repetition_penalty,
        )

    def check_generation_config(self) -> None:
        """Refuse a model whose generation config changes what is sampled in a way the rows
        cannot record (see :mod:`~agent_memory.policies.generation_config`); log the sampling
        fields it asks for that this policy's own settings replace.

        Raises:
            ValueError: such a field, named with the fix.
        """
        config = self.model.generation_config
        check_generation_config(config, None if self.path is None else str(self.path))
        sent = self._generation_config()
        replaced = {
            name: (value, getattr(sent, name))
            for name in ("do_sample", "temperature", "top_k", "top_p", "min_p")
            if (value := getattr(config, name, None)) is not None and value != getattr(sent, name)
        }
        if getattr(config, "repetition_penalty", None) not in (None, self.repetition_penalty):
            replaced["repetition_penalty"] = (config.repetition_penalty, self.repetition_penalty)
        if replaced:
            log.info(
                "hf policy: the model's generation config asks for %s; the policy samples with "
                "its own settings (policy.params) and records them",
                ", ".join(f"{k}={v} (policy: {mine})" for k, (v, mine) in replaced.items()),
            )

    def _generation_config(self) -> Any:
        """The model's generation config with every field of
        :data:`~agent_memory.policies.generation_config.SENT_FIELDS` set from this policy (the
        repetition penalty is applied by its own processor, which skips the left padding)."""
        import copy

        config = copy.deepcopy(self.model.generation_config)
        sampling = self.temperature > 0
        fields = dict(
            max_new_tokens=self.max_new_tokens,
            num_beams=1,
            num_return_sequences=1,
            do_sample=sampling,
            # Greedy: the library defaults, so no "unused sampling flag" warnings.
            temperature=self.temperature if sampling else 1.0,
            top_p=self.top_p if sampling else 1.0,
            top_k=self.top_k if sampling else 50,
            min_p=self.min_p if sampling else None,
            repetition_penalty=1.0,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self._eos or None,
            output_scores=True,
            return_dict_in_generate=True,
        )
        config.update(**{name: fields[name] for name in SENT_FIELDS})
        return config


def _own_config_only(model: Any) -> dict[str, Any]:
    """``generate``'s argument that keeps the model's generation config from replacing the
    fields of the one passed that equal the library defaults (transformers 4.50 to 4.x do that
    unless told not to: a policy's ``temperature=1.0`` would sample at the model's 0.7)."""
    import inspect

    try:
        takes = "use_model_defaults" in inspect.signature(model.generate).parameters
    except (TypeError, ValueError):
        takes = False
    return {"use_model_defaults": False} if takes else {}


def _check_source(path: object, model: object, tokenizer: object) -> None:
    """torch and transformers are installed, and exactly one of ``path`` or the model and its
    tokenizer is given."""
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise ImportError(
                f"the hf policy needs torch and transformers ({module!r} is missing): "
                'pip install "agent-memory[llm]"'
            )
    if (path is None) == (model is None) or (model is None) != (tokenizer is None):
        raise ValueError(
            "pass either path (a local model directory or a cached hub id) or both model "
            f"and tokenizer, got path={path!r}, model={type(model).__name__}, "
            f"tokenizer={type(tokenizer).__name__}"
        )

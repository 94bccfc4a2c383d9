"""Summarizers: fold old steps into a running summary (for
:class:`~agent_memory.memory.compaction.CompactionMemory`).

Built-ins by name: ``extractive`` (:class:`ExtractiveSummarizer`, the default, no model),
``llm`` (:class:`LLMSummarizer`, any :class:`~agent_memory.policies.Policy`, batched) and
``policy`` (:class:`PolicySummarizer`: the acting policy, as a turn of the episode it trains on).

Example:
    >>> s = make_summarizer("extractive")
    >>> steps = [FoldedStep(1, observation="Remember this: the key is RED.\\nSay 'next'.",
    ...                     action="next"),
    ...          FoldedStep(2, observation="A fact.\\nSay 'next'.", action="next")]
    >>> print(s.summarize("", steps, max_tokens=64))
    1: Remember this: the key is RED. -> next
    2: A fact. -> next
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from agent_memory.checks import check_int
from agent_memory.registry import Registry
from agent_memory.tokens import TokenCounter, make_token_counter

if TYPE_CHECKING:
    from agent_memory.policies import Policy

__all__ = [
    "ExtractiveSummarizer",
    "FoldedStep",
    "LLMSummarizer",
    "PolicySummarizer",
    "Summarizer",
    "SummarizerSpec",
    "SummaryRequest",
    "available_summarizers",
    "fit_text",
    "make_summarizer",
    "register_summarizer",
]


@dataclass(slots=True)
class FoldedStep:
    """One step being folded into the summary.

    Attributes:
        step: absolute step number in the episode.
        text: the step as rendered into the prompt (``""`` unless :attr:`Summarizer.reads_text`).
        observation, action, thought: the record's (None when it has no such key).
        offload_id: the id the full observation can be reloaded by (``"obs#3"``), if offloaded.
    """

    step: int
    text: str = ""
    observation: str | None = None
    action: str | None = None
    thought: str | None = None
    offload_id: str | None = None


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """One env's summarization job: its previous summary, the steps to fold, the budget."""

    previous: str
    steps: Sequence[FoldedStep]
    max_tokens: int


class Summarizer(ABC):
    """Turns (previous summary, folded steps) into a new summary within ``max_tokens``."""

    #: Whether a call can block (model calls): the memory then runs it in a thread with a timeout.
    may_block: ClassVar[bool] = True
    #: Whether it reads :attr:`FoldedStep.text` of steps that have an observation.
    reads_text: ClassVar[bool] = True
    #: Whether the acting policy writes the summary as a turn of the episode (the memory then
    #: asks for it with ``turn_prompts`` instead of calling :meth:`summarize`).
    turn: ClassVar[bool] = False

    @abstractmethod
    def summarize(
        self,
        previous_summary: str,
        steps: Sequence[FoldedStep],
        max_tokens: int,
        counter: TokenCounter | None = None,
    ) -> str:
        """The new summary. ``counter`` counts tokens (default: the ``estimate`` counter)."""

    def summarize_batch(
        self, requests: Sequence[SummaryRequest], counter: TokenCounter | None = None
    ) -> list[str]:
        """One summary per request (override to batch model calls)."""
        return [self.summarize(r.previous, r.steps, r.max_tokens, counter) for r in requests]

    @property
    def name(self) -> str:
        """The name events report (the registry name, else the class name)."""
        return getattr(self, "registry_name", type(self).__name__)


_ELLIPSIS = " ..."


def fit_text(text: str, max_tokens: int, counter: TokenCounter | None = None) -> str:
    """``text`` cut at the end (marked with ``" ..."``) so that it counts at most ``max_tokens``.

    Only the first ``256 * (max_tokens + 1)`` characters are considered (a megabyte summary is
    cut, not counted whole by the search for the cut).

    Example:
        >>> fit_text("one two three four five six", 2, make_token_counter("chars"))
        ''
        >>> fit_text("one two three four five six", 12, make_token_counter("chars"))
        'one two ...'
    """
    count = counter or make_token_counter("estimate")
    limit = 256 * (max_tokens + 1)
    if len(text) > limit:
        text = text[:limit]
    elif count(text) <= max_tokens:
        return text
    if count(_ELLIPSIS.strip()) > max_tokens:
        return ""
    lo, hi = 0, len(text)  # the longest prefix whose cut version fits (counts grow with length)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid].rstrip() + _ELLIPSIS) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    prefix = text[:lo].rstrip()
    if 0 < lo < len(text) and not text[lo].isspace() and not text[lo - 1].isspace():
        # The cut falls inside a word: end at the previous word boundary when one is near.
        cut = prefix.rfind(" ")
        if cut >= max(1, len(prefix) - 20):
            prefix = prefix[:cut].rstrip()
    out = (prefix + _ELLIPSIS) if prefix else _ELLIPSIS.strip()
    return out if count(out) <= max_tokens else ""


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _clip_line(line: str, max_chars: int) -> str:
    """One line, whitespace-normalised; a long one is cut to its first sentence, then capped."""
    line = " ".join(line.split())
    if len(line) <= max_chars:
        return line
    m = _SENTENCE_END.search(line)
    if m is not None and m.start() <= max_chars:
        return line[: m.start()]
    return line[: max(1, max_chars - 3)].rstrip() + "..."


def _shown_lines(lines: list[str]) -> set[str]:
    """The observation lines a summary's step lines show (``"k: <line> [obs#k] -> <action>"``)."""
    out = set()
    for ln in lines:
        head, sep, rest = ln.partition(": ")
        if not sep or not head.replace("-", "", 1).isdigit() or rest.startswith("-> "):
            continue
        shown = rest.split(" -> ", 1)[0]
        if shown.endswith("]") and " [obs#" in shown:
            shown = shown[: shown.rindex(" [obs#")]
        if shown:
            out.add(shown)
    return out


_OMITTED = re.compile(r"^\[\.\.\. (\d+) lines? omitted \.\.\.\]$")
_RUN = re.compile(r"^(\d+)(?:-(\d+))?: -> (.*)$")


def _omitted_marker(n: int) -> str:
    return f"[... {n} line{'s' if n != 1 else ''} omitted ...]"


def _fit_lines(lines: list[str], max_tokens: int, count: TokenCounter) -> str:
    """Join ``lines``, dropping the middle ones (counted in one marker line) to fit the budget:
    the head (at most half the budget, fixed once a marker exists) and the newest lines stay."""
    text = "\n".join(lines)
    if count(text) <= max_tokens:
        return text
    n = len(lines)
    marker_at = next(
        (k for k in range(n - 1, -1, -1) if lines[k][:5] == "[... " and _OMITTED.match(lines[k])),
        None,
    )
    costs = count.count_many([ln + "\n" for ln in lines])
    if marker_at is None:
        omitted, head_end, used = 0, 0, 0
        while head_end < n and used + costs[head_end] <= max_tokens // 2:
            used += costs[head_end]
            head_end += 1
        tail_start = head_end
    else:
        m = _OMITTED.match(lines[marker_at])
        assert m is not None
        omitted, head_end, tail_start = int(m.group(1)), marker_at, marker_at + 1
    # Lines kept: [0, head_end) and [tail_start, n); the marker cost is bounded with the most
    # lines that could be omitted, so one pass of drops suffices (verified below).
    marker_cost = count(_omitted_marker(omitted + n) + "\n")
    cost = sum(costs[:head_end]) + sum(costs[tail_start:])
    dropped = 1  # the text does not fit: at least one line goes
    while True:
        while dropped or (cost + marker_cost > max_tokens and (head_end or tail_start < n)):
            if tail_start < n:
                cost -= costs[tail_start]
                tail_start += 1
            elif head_end:
                head_end -= 1
                cost -= costs[head_end]
            else:
                break
            omitted += 1
            dropped = 0
        marker = _omitted_marker(omitted)
        out = "\n".join([*lines[:head_end], marker, *lines[tail_start:]])
        if count(out) <= max_tokens:
            return out
        if not head_end and tail_start >= n:  # not even the marker fits
            return fit_text(out, max_tokens, count)
        dropped = 1  # a real tokenizer's counts are not exactly additive: one more, retry


S = TypeVar("S", bound=Callable[..., Summarizer])
_REGISTRY: Registry[Summarizer] = Registry(
    "summarizer",
    hint=" (or a Summarizer instance; register yours with "
    "agent_memory.memory.compaction.register_summarizer)",
    instance_of=Summarizer,
    name_attr="registry_name",  # read back by Summarizer.name
    builtins={
        "extractive": "agent_memory.memory.compaction.summarizers:ExtractiveSummarizer",
        "llm": "agent_memory.memory.compaction.summarizers:LLMSummarizer",
        "policy": "agent_memory.memory.compaction.summarizers:PolicySummarizer",
    },
)
SummarizerSpec = str | Summarizer | Mapping[str, Any]


def register_summarizer(name: str, *, overwrite: bool = False) -> Callable[[S], S]:
    """Class decorator: make a summarizer available to :func:`make_summarizer` as ``name``."""
    return _REGISTRY.register(name, overwrite=overwrite)


def available_summarizers() -> list[str]:
    """Names :func:`make_summarizer` accepts."""
    return _REGISTRY.names()


def make_summarizer(spec: SummarizerSpec = "extractive", **kwargs: Any) -> Summarizer:
    """A summarizer from a registered name, a ``{"name": ..., **kwargs}`` mapping or an instance.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
        TypeError: a spec of another type.

    Example:
        >>> make_summarizer("abstractive")
        Traceback (most recent call last):
        ...
        ValueError: unknown summarizer 'abstractive': expected one of ['extractive', 'llm', ...
    """
    return _REGISTRY.build(spec, **kwargs)


class ExtractiveSummarizer(Summarizer):
    """A deterministic summary that needs no model: one line per folded step.

    Step ``k`` becomes ``"k: <line> -> <action>"``: the first observation line the summary does
    not show yet and the action's first line (runs of steps with nothing new merge:
    ``"k1-k2: -> <action>"``). Over budget, the middle lines are dropped behind a
    ``"[... n lines omitted ...]"`` marker, so an early cue survives a long episode.

    Args:
        max_line_chars: cap on each kept observation/action line.
    """

    registry_name = "extractive"

    may_block: ClassVar[bool] = False
    reads_text: ClassVar[bool] = False

    def __init__(self, max_line_chars: int = 160) -> None:
        self.max_line_chars = check_int("max_line_chars", max_line_chars, 8)

    def summarize(
        self,
        previous_summary: str,
        steps: Sequence[FoldedStep],
        max_tokens: int,
        counter: TokenCounter | None = None,
    ) -> str:
        count = counter or make_token_counter("estimate")
        lines = previous_summary.splitlines() if previous_summary else []
        # Lines already in the summary: those its step lines show, plus those met in this call.
        seen = _shown_lines(lines)
        for s in steps:
            new = self._new_line(str(s.observation if s.observation is not None else s.text), seen)
            act = None if s.action is None else self._action_line(str(s.action))
            if new:
                ref = f" [{s.offload_id}]" if s.offload_id else ""
                lines.append(f"{s.step}: {new}{ref}" + ("" if act is None else f" -> {act}"))
            elif act is not None and not _extend_run(lines, s.step, act):
                lines.append(f"{s.step}: -> {act}")
        return _fit_lines(lines, max_tokens, count)

    def _new_line(self, source: str, seen: set[str]) -> str:
        """The first line of ``source`` not in ``seen``, clipped ("": none); updates ``seen``."""
        cap = self.max_line_chars
        scan = 64 * cap
        if len(source) > scan:  # whole lines of the part read (one cut line if none ends)
            head = source[:scan]
            cut = max(head.rfind("\n"), head.rfind("\r"))
            source = head[:cut] if cut > 0 else head
        for raw in source.splitlines():
            if raw in seen:  # the common case for observations that repeat line by line
                continue
            seen.add(raw)
            line = raw.strip()
            if not line:
                continue
            if len(line) > cap or "  " in line or "\t" in line:
                line = _clip_line(line, cap)
            if line != raw:
                if line in seen:
                    continue
                seen.add(line)
            return line
        return ""

    def _action_line(self, action: str) -> str:
        """The action's first non-empty line, clipped."""
        cap = self.max_line_chars
        act = action.strip()[: 64 * cap]
        if len(act) > cap or "\n" in act or "  " in act or "\t" in act:
            first = next((a for a in act.splitlines() if a.strip()), "")
            act = _clip_line(first, cap)
        return act

    def __repr__(self) -> str:
        return f"ExtractiveSummarizer(max_line_chars={self.max_line_chars})"


def _extend_run(lines: list[str], step: int, action: str) -> bool:
    """Extend the last line to ``step`` if it is a run up to ``step - 1`` of ``action`` alone."""
    m = _RUN.match(lines[-1]) if lines else None
    if m is None or m.group(3) != action or int(m.group(2) or m.group(1)) != step - 1:
        return False
    lines[-1] = f"{m.group(1)}-{step}: -> {action}"
    return True


DEFAULT_SUMMARY_PROMPT = (
    "You keep a running summary of an agent's interaction with an environment. Update the "
    "summary with the new steps below. Keep every fact that may matter later (instructions, "
    "cues to remember, goals, places, items, what each action achieved); drop repetition. "
    "Answer with the updated summary only, in at most {max_words} words.\n\n"
    "Summary so far (steps before {first_step}):\n{previous}\n\n"
    "New steps {first_step}-{last_step}:\n{steps}\n\nUpdated summary:"
)


class LLMSummarizer(Summarizer):
    """Asks a :class:`~agent_memory.policies.Policy` to update the summary (one batched call).

    An empty answer is an error (the memory then falls back to truncation).

    Args:
        policy: a Policy, a registered policy name or a ``{"name": ..., **kwargs}`` mapping.
        prompt: a ``str.format`` template with fields ``previous``, ``steps``, ``first_step``,
            ``last_step``, ``max_tokens`` and ``max_words``.
        max_step_chars: cap on each step's text in the prompt.
    """

    registry_name = "llm"

    _FIELDS = frozenset({"previous", "steps", "first_step", "last_step", "max_tokens", "max_words"})

    def __init__(
        self,
        policy: Policy | str | Mapping[str, Any],
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        max_step_chars: int = 2000,
    ) -> None:
        from agent_memory.policies import Policy, make_policy

        if isinstance(policy, str):
            policy = make_policy(policy)
        elif isinstance(policy, Mapping):
            params = dict(policy)
            name = params.pop("name", None)
            if name is None:
                raise ValueError(
                    f"the llm summarizer's policy mapping needs a 'name' key, got {sorted(params)}"
                )
            policy = make_policy(name, **params)
        if not isinstance(policy, Policy):
            raise TypeError(
                "the llm summarizer needs a Policy (or a policy name / config mapping), "
                f"got {type(policy).__name__}"
            )
        self.policy = policy
        self._set_prompt(prompt, max_step_chars)

    def _set_prompt(self, prompt: str, max_step_chars: int) -> None:
        import string

        try:
            used = {f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None}
        except ValueError as e:
            raise ValueError(f"summary prompt is not a valid format string: {e}") from e
        unknown = used - self._FIELDS
        if unknown:
            raise ValueError(
                f"summary prompt uses unknown field(s) {sorted(unknown)}: expected some of "
                f"{sorted(self._FIELDS)}"
            )
        self.prompt = prompt
        self.max_step_chars = check_int("max_step_chars", max_step_chars, 1)

    def build_prompt(self, request: SummaryRequest) -> str:
        """The prompt sent to the policy for one env."""
        cap = self.max_step_chars
        texts = []
        for s in request.steps:
            t = s.text.strip() if s.text else f"Observation: {s.observation}\nAction: {s.action}"
            texts.append(t if len(t) <= cap else t[:cap] + " ...")
        first = request.steps[0].step if request.steps else 0
        last = request.steps[-1].step if request.steps else 0
        return self.prompt.format(
            previous=request.previous or "(none)",
            steps="\n".join(texts),
            first_step=first,
            last_step=last,
            max_tokens=request.max_tokens,
            max_words=max(1, request.max_tokens * 3 // 4),
        )

    def summarize(
        self,
        previous_summary: str,
        steps: Sequence[FoldedStep],
        max_tokens: int,
        counter: TokenCounter | None = None,
    ) -> str:
        request = SummaryRequest(previous_summary, steps, max_tokens)
        return self.summarize_batch([request], counter)[0]

    def summarize_batch(
        self, requests: Sequence[SummaryRequest], counter: TokenCounter | None = None
    ) -> list[str]:
        if not requests:
            return []
        prompts = [self.build_prompt(r) for r in requests]
        answers = self.policy.act(prompts)
        if len(answers) != len(prompts):
            raise ValueError(
                f"the summarizer policy returned {len(answers)} answers for {len(prompts)} prompts"
            )
        out = []
        count = counter or make_token_counter("estimate")
        for a, r in zip(answers, requests, strict=True):
            text = str(a).strip()
            if not text:
                raise ValueError("the summarizer policy returned an empty summary")
            out.append(fit_text(text, r.max_tokens, count))
        return out

    def __repr__(self) -> str:
        return f"LLMSummarizer(policy={type(self.policy).__name__})"


class PolicySummarizer(LLMSummarizer):
    """The acting policy writes the summary, as a turn of its episode (ReSum, CompactionRL).

    It is never called inline: the memory keeps the steps due verbatim and asks for the summary
    (``turn_prompts``, this prompt); the rollout engine sends it to the policy before the env's
    next action, and its answer (``answer_turns``) becomes the summary. The turn's prompt ids,
    sampled ids and log-probs are rows of the episode (``memory_turn``), trained with the
    advantage of the action they prepare. An empty answer falls back to truncation.

    Args:
        prompt, max_step_chars: as for :class:`LLMSummarizer`.

    Example:
        >>> s = make_summarizer("policy", prompt="Sum up {steps} in {max_words} words:")
        >>> s.turn, s.build_prompt(SummaryRequest("", [FoldedStep(1, "go north")], 8))
        (True, 'Sum up go north in 6 words:')
    """

    registry_name = "policy"
    turn = True

    def __init__(self, prompt: str = DEFAULT_SUMMARY_PROMPT, max_step_chars: int = 2000) -> None:
        self._set_prompt(prompt, max_step_chars)

    def summarize_batch(
        self, requests: Sequence[SummaryRequest], counter: TokenCounter | None = None
    ) -> list[str]:
        raise RuntimeError(
            "summarizer=policy is answered by the acting policy as a turn of the episode (the "
            "rollout engine asks for it); it has no summary to give inline"
        )

    def __repr__(self) -> str:
        return "PolicySummarizer()"

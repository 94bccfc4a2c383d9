"""CodeEnv: answer questions about a shop API by running Python in a sandbox (CodeAct style).

``<code>source</code>`` runs the code in the episode's persistent sandbox (variables survive
between steps; a timeout or crash restarts it and loses them); ``<answer>text</answer>`` ends the
episode, scored by :func:`~agent_memory.envs.code_exec.tasks.is_correct` outside the sandbox, so
code cannot tamper with the reward. Anything else is invalid. ``state_key`` hashes the task,
whether an answer was submitted and the sandbox's variable names and types.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal, SupportsFloat, cast

from agent_memory import checks
from agent_memory.envs.base import (
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    check_int,
    echo,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)
from agent_memory.envs.code_exec import api
from agent_memory.envs.code_exec.sandbox import RunResult, Sandbox, SandboxLimits
from agent_memory.envs.code_exec.tasks import TASKS, Task, is_correct

__all__ = ["CodeEnv", "parse_action"]

ActionKind = Literal["code", "answer"]
#: Each tag as a case-insensitive literal: searching for one is a linear scan in C.
_TAGS: dict[ActionKind, tuple[re.Pattern[str], re.Pattern[str]]] = {
    kind: (re.compile(f"<{kind}>", re.IGNORECASE), re.compile(f"</{kind}>", re.IGNORECASE))
    for kind in ("code", "answer")
}
#: ``<code>`` blocks of more lines are invalid: no honest step is that long, and the bound keeps
#: the dedent below (the only per-line work) fast.
MAX_CODE_LINES = 10_000
#: Longer ``<answer>`` blocks are invalid (answers are a number or a name; this bounds the
#: normalisation before comparing).
MAX_ANSWER_CHARS = 1000
_MAX_COUNTED_BLOCKS = 99
_BLANKS = re.compile(r"[ \t]*")
_MARKER = "\n[... {n} characters omitted ...]\n"


def _count_blocks(action: str, opening: re.Pattern[str], closing: re.Pattern[str]) -> int:
    """Blocks in ``action`` (each from an opening tag to the next closing tag or the end; tags
    inside a block are its text), counted up to ``_MAX_COUNTED_BLOCKS + 1``."""
    count, pos = 0, 0
    while count <= _MAX_COUNTED_BLOCKS:
        start = opening.search(action, pos)
        if start is None:
            break
        count += 1
        end = closing.search(action, start.end())
        if end is None:
            break
        pos = end.end()
    return count


def _is_fence_info(line: str) -> bool:
    r"""Whether ``line`` (after an opening fence) is ``[\w+-]*[ \t]*``: an optional language."""
    lang = line.rstrip(" \t")
    word = lang.replace("_", "").replace("+", "").replace("-", "")
    return not word or word.isalnum()  # isalnum() is exactly what \w adds to "_"


def _unfence(body: str) -> str | None:
    r"""The content of ``body`` if it is exactly one Markdown fence (language tag optional).

    What ``^\s*```[\w+-]*[ \t]*\n(.*?)\n?[ \t]*```\s*$`` (DOTALL) matched, in linear time with
    string methods: the closing fence is the last non-space text.
    """
    start = len(body) - len(body.lstrip())
    if not body.startswith("```", start):
        return None
    newline = body.find("\n", start + 3)
    if newline < 0 or not _is_fence_info(body[start + 3 : newline]):
        return None
    content_start, end = newline + 1, len(body.rstrip())
    if end - 3 < content_start or not body.endswith("```", 0, end):
        return None
    content = body[content_start : end - 3].rstrip(" \t")
    return content[:-1] if content.endswith("\n") else content


def _common_prefix(a: str, b: str) -> str:
    """The longest common prefix of ``a`` and ``b`` (binary search over C comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return a[:lo]


def _dedent(code: str) -> str:
    """Exactly ``textwrap.dedent(code)``, in linear time: per-line work is C string methods
    (``parse_action`` bounds the lines), nothing at all when no line starts with a blank."""
    if not (code.startswith((" ", "\t")) or "\n " in code or "\n\t" in code):
        return code  # no indented and no whitespace-only line: dedent returns it unchanged
    lines, indents = code.split("\n"), []
    for i, line in enumerate(lines):
        blanks = _BLANKS.match(line).end()  # type: ignore[union-attr]  # always matches
        if blanks == len(line):
            lines[i] = ""  # whitespace-only lines become empty, as textwrap does
        else:
            indents.append(line[:blanks])
    # the common prefix of all indents is the common prefix of the smallest and the largest
    margin = _common_prefix(min(indents), max(indents)) if indents else ""
    if margin:
        lines = [line[len(margin) :] if line.startswith(margin) else line for line in lines]
    return "\n".join(lines)


def parse_action(action: str) -> tuple[ActionKind | None, str, str]:
    """Split an action into ``(kind, body, invalid_reason)``; ``kind`` is None when invalid.

    Linear in the action's length (literal searches and string methods, no backtracking).

    Example:
        >>> parse_action("I will look. <code>print(1)</code>")
        ('code', 'print(1)', '')
        >>> parse_action("<answer> 42 </answer>")
        ('answer', '42', '')
        >>> parse_action("<code>```python\\nx = 1\\n```")
        ('code', 'x = 1', '')
        >>> parse_action("up")[0] is None
        True
    """
    if not isinstance(action, str):
        return None, "", f"the action must be a string, got {type(action).__name__}"
    found = {kind: tags[0].search(action) for kind, tags in _TAGS.items()}
    present = {kind: m for kind, m in found.items() if m is not None}
    if not present:
        return None, "", f"no <code>...</code> or <answer>...</answer> block in {echo(action)!r}"
    if len(present) > 1:
        return None, "", "found both <code> and <answer>; send one per step"
    kind, first = present.popitem()
    opening, closing = _TAGS[kind]
    end = closing.search(action, first.end())
    body = action[first.end() :] if end is None else action[first.end() : end.start()]
    if end is not None and opening.search(action, end.end()):  # a second block
        count = _count_blocks(action, opening, closing)
        many = f"more than {_MAX_COUNTED_BLOCKS}" if count > _MAX_COUNTED_BLOCKS else str(count)
        return None, "", f"found {many} <{kind}> blocks; send one per step"
    if kind == "code":
        if body.count("\n") >= MAX_CODE_LINES:
            lines = body.count("\n") + 1
            return None, "", f"the <code> block has {lines} lines (at most {MAX_CODE_LINES})"
        fenced = _unfence(body)
        body = _dedent(fenced if fenced is not None else body).strip("\n")
        body = body if body.strip() else ""
    else:
        body = body.strip()
        if len(body) > MAX_ANSWER_CHARS:
            why = f"the <answer> block has {len(body)} characters (at most {MAX_ANSWER_CHARS})"
            return None, "", why
    if not body:
        return None, "", f"the <{kind}> block is empty"
    return cast(ActionKind, kind), body, ""


def _cut_middle(head: str, omitted: int, tail: str, cap: int) -> str:
    """``head + tail`` within ``cap`` characters, the middle replaced by a marker."""
    if not omitted and len(head) + len(tail) <= cap:
        return head + tail
    keep_head, keep_tail = cap // 2, cap - cap // 2
    if omitted:  # the child already dropped the middle: cut each side
        head_part, tail_part = head[:keep_head], tail[-keep_tail:]
    else:
        text = head + tail
        head_part, tail_part = text[:keep_head], text[-keep_tail:]
    dropped = len(head) + omitted + len(tail) - len(head_part) - len(tail_part)
    return head_part + _MARKER.format(n=dropped) + tail_part


class CodeEnv(TextEnv):
    """Answer shop-data questions by writing Python that calls a preloaded ``api`` module.

    Args:
        max_obs_chars, timeout_s, cpu_limit_s, memory_limit_mb, max_file_size_mb, max_disk_mb:
            the sandbox's :class:`~agent_memory.envs.code_exec.results.SandboxLimits`
            (``output_chars``, ``timeout_s``, ``cpu_s``, ``memory_mb``, ``file_size_mb``,
            ``disk_mb``); over ``max_disk_mb`` the episode ends (terminated, reward 0).
        max_action_chars: the action space's length (longer actions are still parsed).
        landlock: use Linux Landlock when available (kernel-enforced write confinement).
        isolate_network: put the sandbox in its own network namespace when allowed.

    Example:
        >>> env = CodeEnv(timeout_s=10.0)
        >>> obs, info = env.reset(seed=0, options={"task_index": 3})
        >>> obs.splitlines()[0] == "Task: " + info["task"]
        True
        >>> obs, reward, terminated, truncated, info = env.step("<code>x = 6 * 7\\nx</code>")
        >>> obs, info["is_action_valid"]
        ('42\\n', True)
        >>> obs, reward, terminated, *_ = env.step(env.unwrapped.oracle_action())
        >>> _ = env.step(env.unwrapped.oracle_action())
        >>> obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        >>> reward, terminated, info["won"]
        (1.0, True, True)
        >>> env.close()
    """

    # gymnasium.Env declares metadata an instance attribute: a ClassVar would clash with it.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012
    tasks: ClassVar[tuple[Task, ...]] = TASKS

    def __init__(
        self,
        render_mode: Literal["ansi"] | None = None,
        *,
        max_obs_chars: int = 4000,
        timeout_s: float = 10.0,
        cpu_limit_s: int = 60,
        memory_limit_mb: int = 512,
        max_file_size_mb: int = 16,
        max_disk_mb: int = 64,
        max_action_chars: int = 16000,
        landlock: bool = True,
        isolate_network: bool = True,
    ) -> None:
        super().__init__(render_mode)
        check_int("max_obs_chars", max_obs_chars, 200)
        check_int("cpu_limit_s", cpu_limit_s, 1)
        check_int("memory_limit_mb", memory_limit_mb, 64)
        check_int("max_file_size_mb", max_file_size_mb, 1)
        check_int("max_disk_mb", max_disk_mb, 1)
        check_int("max_action_chars", max_action_chars, 100)
        checks.check_number("timeout_s", timeout_s, low=0, low_open=True)
        self.max_obs_chars = max_obs_chars
        self.limits = SandboxLimits(
            timeout_s=float(timeout_s),
            cpu_s=cpu_limit_s,
            memory_mb=memory_limit_mb,
            file_size_mb=max_file_size_mb,
            disk_mb=max_disk_mb,
            output_chars=max_obs_chars,
        )
        self._landlock = landlock
        self._isolate_network = isolate_network
        self._intro = self._instructions()
        longest_task = max(len(t.question) for t in self.tasks)
        self._obs_max = max(max_obs_chars, len(self._intro) + longest_task) + 1000
        self.observation_space = text_space(self._obs_max)
        self.action_space = text_space(max_action_chars)
        self._sandbox: Sandbox | None = None
        self._task: Task = self.tasks[0]
        self._names: tuple[tuple[str, str], ...] = ()
        self._submitted = self._won = False

    # --- text ------------------------------------------------------------------------------------

    def _instructions(self) -> str:
        return (
            "You work in a persistent Python sandbox (like a Jupyter kernel: variables and imports "
            "persist between steps) with a preloaded module `api` for a fictitious online shop:\n"
            f"{api.describe()}\n"
            "help(api.<function>) shows details. Only the standard library is available.\n\n"
            "Reply with exactly one action per step:\n"
            "<code>python code</code> runs the code; you see what it prints, the value of a final "
            "expression, or the error.\n"
            "<answer>your final answer</answer> submits it and ends the episode.\n"
            f"Limits: {self.limits.timeout_s:g} s per step (a timeout restarts the sandbox and "
            f"loses all variables), {self.limits.memory_mb} MiB of memory, "
            f"{self.limits.disk_mb} MiB of files (more ends the episode); output beyond "
            f"{self.max_obs_chars} characters is cut in the middle."
        )

    def _observe(self, text: str) -> str:
        # Cut first: sanitize() escapes character by character, and escapes only lengthen the
        # text, so this is sanitize(text, cap) without touching the rest of a huge action.
        self._last_obs = sanitize(text[: self._obs_max + 1], self._obs_max)
        return self._last_obs

    def _format_result(self, result: RunResult) -> str:
        head, tail = sanitize(result.head), sanitize(result.tail)
        text = _cut_middle(head, result.omitted, tail, self.max_obs_chars)
        if result.note:
            text = f"{text}\n[sandbox] {result.note}" if text else f"[sandbox] {result.note}"
        return text if text else "(no output)"

    # --- info ------------------------------------------------------------------------------------

    def _state_key(self) -> str:
        return stable_hash("code", self._task.id, self._submitted, self._names)

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {
            TASK: self._task.question,
            WON: self._won,
            STATE_KEY: self._state_key(),
            "task_id": self._task.id,
            **extra,
        }

    # --- gym API ---------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if "task_index" in options:
            index = options["task_index"]
            if isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"task_index must be an int, got {index!r}")
            if not 0 <= index < len(self.tasks):
                raise ValueError(f"task_index must be in [0, {len(self.tasks) - 1}], got {index}")
        else:
            index = int(self.np_random.integers(len(self.tasks)))
        self._task = self.tasks[index]
        self._names = ()
        self._submitted = self._won = False
        if self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = Sandbox(
            self.limits, landlock=self._landlock, isolate_network=self._isolate_network
        )
        obs = self._observe(f"Task: {self._task.question}\n\n{self._intro}")
        return obs, self._info()

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._sandbox is None:
            raise RuntimeError("call reset() before step()")
        if self._submitted or self._sandbox.closed:
            why = "an answer was submitted" if self._submitted else "the disk quota was exceeded"
            return self._invalid(f"the episode is over ({why}); call reset()")
        kind, body, reason = parse_action(action)
        if kind is None:
            return self._invalid(reason)
        if kind == "answer":
            self._submitted = True
            self._won = is_correct(body, self._task)
            verdict = "Correct." if self._won else "Incorrect."
            obs = self._observe(f"Submitted answer: {body}\n{verdict}")
            info = step_info(self._info(sandbox_status="submitted"))
            return obs, float(self._won), True, False, info
        result = self._sandbox.run(body)
        self._names = result.names
        obs = self._observe(self._format_result(result))
        info = step_info(self._info(sandbox_status=result.status))
        return obs, 0.0, result.status == "quota", False, info

    def _invalid(self, reason: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs = self._observe(
            f"Invalid action: {reason}.\nReply with <code>python code</code> or "
            "<answer>your final answer</answer>."
        )
        over = self._submitted or (self._sandbox is not None and self._sandbox.closed)
        return obs, 0.0, over, False, step_info(self._info(), reason)

    def oracle_action(self) -> str:
        """The scripted expert's next action: the first task step whose variables are missing."""
        names = {name for name, _ in self._names}
        for step in self._task.steps:
            if not set(step.defines) <= names:
                return f"<code>\n{step.code}</code>"
        return f"<answer>{self._task.answer}</answer>"

    @property
    def sandbox(self) -> Sandbox | None:
        """The current episode's sandbox (None before the first reset and after close)."""
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
        super().close()

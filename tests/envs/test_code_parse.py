"""The Code env's action parser: same results as the regex version it replaced, linear time.

The reference below is the parser as it was before the fix (regexes, ``textwrap.dedent``); it
is only ever run on short inputs, where its backtracking is harmless.
"""

from __future__ import annotations

import random
import re
import textwrap

import pytest

from agent_memory.envs.code_exec import env as code_env
from agent_memory.envs.code_exec.env import MAX_ANSWER_CHARS, MAX_CODE_LINES, parse_action

_TAG = re.compile(r"<(code|answer)>", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?[ \t]*```\s*$", re.DOTALL)


def reference(action: str) -> tuple[str | None, str, str]:
    """``parse_action`` before the fix (without the newer length limits)."""
    opened = list(_TAG.finditer(action))
    if not opened:
        echo = action[:40] + ("..." if len(action) > 40 else "")
        return None, "", f"no <code>...</code> or <answer>...</answer> block in {echo!r}"
    kinds = {m.group(1).lower() for m in opened}
    if len(kinds) > 1:
        return None, "", "found both <code> and <answer>; send one per step"
    kind = kinds.pop()
    closing = re.compile(rf"</{kind}>", re.IGNORECASE)
    blocks, pos = [], 0
    for m in opened:
        if m.start() < pos:
            continue
        end = closing.search(action, m.end())
        blocks.append(action[m.end() : end.start() if end else len(action)])
        pos = end.end() if end else len(action)
    if len(blocks) > 1:
        return None, "", f"found {len(blocks)} <{kind}> blocks; send one per step"
    body = blocks[0]
    if kind == "code":
        fenced = _FENCE.match(body)
        body = textwrap.dedent(fenced.group(1) if fenced else body).strip("\n")
        body = body if body.strip() else ""
    else:
        body = body.strip()
    if not body:
        return None, "", f"the <{kind}> block is empty"
    return kind, body, ""


ATOMS = [
    "<code>",
    "</code>",
    "<CODE>",
    "</Code>",
    "<answer>",
    "</answer>",
    "<Answer>",
    "```",
    "```python",
    "```py ",
    "``` \t",
    "```c++",
    "\n",
    " ",
    "\t",
    "  ",
    "\n    ",
    "\n\t",
    " \t\n",
    "x = 1",
    "print(2)",
    "a",
    "`",
    "<",
    ">",
    "/",
    "\r",
    "\x0c",
    "\u00a0",
    "\u2003",
    "\u0130",
    "\u0663",
    "-",
    "_",
]


def test_same_results_as_the_regex_parser_on_random_actions() -> None:
    rng = random.Random(0)
    for _ in range(20_000):
        action = "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 14)))
        assert parse_action(action) == reference(action), repr(action)


@pytest.mark.parametrize(
    "text",
    [
        "    a\n      b\n\n    c",
        "\ta\n\t\tb",
        "  a\n\tb",
        " \n  x\n  \n  y  ",
        "x\n  y",
        "\r\n  z",
        "  " + "\u2003x",
        "   \n   ",
        "",
    ],
)
def test_dedent_is_textwrap_dedent(text: str) -> None:
    assert code_env._dedent(text) == textwrap.dedent(text)


N = 1_000_000  # characters of hostile text per case
HOSTILE = {
    "unclosed fence and a blank run": (
        "<code>```\n" + " " * N + "x",
        ("code", "```\n" + " " * N + "x"),
    ),
    "closed fence around a blank run": ("<code>```py\n" + " " * N + "x\n```", ("code", "x")),
    "many unclosed fences": ("<code>" + "```\n" * (N // 4), "lines"),
    "fences between blanks": ("<code>```\n" + (" " * 50 + "``` \n") * (N // 55), "lines"),
    "many opening tags": ("<code>" * (N // 6), ("code", "<code>" * (N // 6 - 1))),
    "many blocks": (
        "<code>x</code>" * (N // 14),
        (None, "", "found more than 99 <code> blocks; send one per step"),
    ),
    "many closing tags": (
        "<code>a" + "</code>" * (N // 7) + "<code>b",
        (None, "", "found 2 <code> blocks; send one per step"),
    ),
    "a blank run": ("<code>" + " \t" * (N // 2), (None, "", "the <code> block is empty")),
    "a long language word": ("<code>```" + "a" * N, ("code", "```" + "a" * N)),
    "indented lines": (
        "<code>" + "    x\n" * 9000 + "    " + "y" * (N - 54_000),
        ("code", "x\n" * 9000 + "y" * (N - 54_000)),
    ),
    "both kinds": (
        "<code>" * (N // 12) + "<ANSWER>" * (N // 16),
        (None, "", "found both <code> and <answer>; send one per step"),
    ),
    "no tag": ("<cod>" * (N // 5), "no tag"),
    "a long answer": (
        "<answer>" + "1" * N,
        (None, "", f"the <answer> block has {N} characters (at most {MAX_ANSWER_CHARS})"),
    ),
}


def test_hostile_megabyte_actions_are_parsed_correctly() -> None:
    # What each case parses to, not how fast: scripts/bench_parse.py times every hostile case
    # at 1 MB against the same case at 1 KB (linear: ~1,000x; the old fence regex, quadratic,
    # needed seconds for 80k characters). A quadratic return would run past the per-test timeout.
    for name, (action, expected) in HOSTILE.items():
        result = parse_action(action)
        if expected == "lines":
            lines = action.count("\n") + 1
            reason = f"the <code> block has {lines} lines (at most {MAX_CODE_LINES})"
            assert result == (None, "", reason), name
        elif expected == "no tag":
            assert result[0] is None and result[2].startswith("no <code>"), name
        else:
            assert result == (*expected, "")[:3], name


def test_block_limits_are_named() -> None:
    code = "<code>" + "x\n" * MAX_CODE_LINES + "</code>"
    assert (
        parse_action(code)[2]
        == f"the <code> block has {MAX_CODE_LINES + 1} lines (at most {MAX_CODE_LINES})"
    )
    assert parse_action("<code>" + "x\n" * (MAX_CODE_LINES - 1) + "</code>")[0] == "code"
    assert parse_action("<answer>" + "9" * MAX_ANSWER_CHARS + "</answer>")[0] == "answer"
    # (?i) matches "s" to U+017F as well; the regex version returned the kind "an\u017fwer"
    assert parse_action("<an\u017fwer>42</ANSWER>") == ("answer", "42", "")

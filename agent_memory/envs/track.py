"""Track: a memory probe that only a memory keeping the right thing, overwritten, can solve.

The task text names a target object ("At the end you will be asked the current colour of the
mug."). Each step shows one line: an announcement ("Now the kite is blue.") about any of the
episode's ``num_objects`` objects, or a distractor fact. Every object's colour is announced at the
start and then changes at random steps. The last step asks "What colour is it now?" without naming
the object; the options hold the target's current colour, its earlier colours and the other
objects' colours. One line of memory, overwritten at each update of the target, answers it at any
``horizon``; a window of recent steps sees the target's last update only when it happened lately.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, Literal, get_args

import numpy as np

from agent_memory.checks import check_choice
from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    check_int,
    is_int,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)
from agent_memory.envs.recall import COLOURS, DISTRACTOR_FACTS, OBJECTS
from agent_memory.envs.text_adapter import match_action, normalize_action

__all__ = ["COLOURS", "DISTRACTOR_FACTS", "OBJECTS", "TrackEnv"]

_NEXT: Final = "next"
# "Now the K is V.": the frame "the K is V" a pretrained model reads back (the tiny model's
# pretraining reads "the K is" -> V; it read 0.01 of "the K is now" -> V).
_ANNOUNCE_RE: Final = re.compile(r"\bNow the ([A-Za-z]+) is ([A-Za-z]+)\.", re.IGNORECASE)
_TARGET_RE: Final = re.compile(r"current colou?r of the ([A-Za-z]+)", re.IGNORECASE)
_QUESTION: Final = "Question: what colour is it now?"

Phase = Literal["step", "question", "done"]
#: What an invalid response does to a step: it passes as ``"next"`` would ("passes": the
#: announcements do not wait, so an unreadable response costs that step's line and, at the
#: question, the answer) or is shown again until ``max_steps`` ("repeats"; greedy play that
#: writes the same invalid response to the same prompt then never gets past it).
InvalidStep = Literal["passes", "repeats"]


def _target_sentence(target: str) -> str:
    return f"At the end you will be asked the current colour of the {target}."


class TrackEnv(TextEnv):
    """Colour announcements and distractor facts, then a question about the target's colour now.

    With ``S = steps * horizon`` steps before the question, the first ``num_objects`` steps
    announce each object's colour (in random order); each object then changes colour
    ``updates * horizon`` times, at random later steps (each change to another colour); the
    other steps are distractor facts. Every step before the question admits only ``"next"``; the
    question admits ``num_choices`` shuffled colours, and the target's current one gives reward 1
    and ``won``. An invalid response (``info["is_action_valid"]`` False) passes the step as
    ``"next"`` would, and at the question ends the episode unanswered (``invalid_step="passes"``),
    or leaves the step to be answered again (``"repeats"``). ``horizon`` scales steps and updates
    together, so the density of the target's updates, and what a window of recent steps sees,
    stays the same at 10x and 100x.

    Args:
        steps: Steps before the question at ``horizon=1``.
        updates: Colour changes of each object at ``horizon=1``.
        num_objects: Objects per episode (1 .. ``len(OBJECTS)``); the target is one of them.
        num_choices: Options at the question (2 .. ``len(COLOURS)``).
        horizon: Multiplies ``steps`` and ``updates``.
        invalid_step: ``"passes"`` or ``"repeats"``: what an invalid response does (above).
        max_steps: Steps before truncation; default ``steps * horizon + 4``.
        render_mode: ``"ansi"`` makes :meth:`render` return the current observation.

    Example:
        >>> env = TrackEnv(steps=5, updates=1, num_objects=2, num_choices=3)
        >>> obs, info = env.reset(seed=1)
        >>> print(obs)
        At the end you will be asked the current colour of the umbrella.
        Now the umbrella is blue.
        >>> history = [obs]
        >>> while info["admissible_actions"] == ["next"]:
        ...     obs, reward, terminated, truncated, info = env.step("next")
        ...     history.append(obs)
        >>> print("\\n".join(history[1:]))
        Now the car is red.
        Now the car is purple.
        Did you know? A day on Venus is longer than its year.
        Now the umbrella is grey.
        Question: what colour is it now?
        Answer with one of: blue, grey, purple.
        >>> options = info["admissible_actions"]
        >>> TrackEnv.solve_from_text("\\n".join(history), options), env.oracle_action()
        ('grey', 'grey')
        >>> TrackEnv.solve_from_text("\\n".join([history[0], history[-1]]), options)  # stale
        'blue'
        >>> obs, reward, terminated, truncated, info = env.step("grey")
        >>> obs, reward, terminated, info["won"]
        ('Correct: the umbrella is GREY.', 1.0, True, True)
        >>> obs, info = env.reset(seed=1)
        >>> env.step("wait")[0]  # invalid: the step passes all the same (invalid_step="passes")
        'Now the car is red.'
    """

    def __init__(
        self,
        steps: int = 40,
        updates: int = 1,
        num_objects: int = 4,
        num_choices: int = 4,
        horizon: int = 1,
        invalid_step: InvalidStep = "passes",
        max_steps: int | None = None,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        self.horizon = check_int("horizon", horizon, 1)
        self.updates = check_int("updates", updates, 0)
        self.invalid_step: InvalidStep = check_choice(
            "invalid_step", invalid_step, get_args(InvalidStep)
        )
        if not is_int(num_objects) or not 1 <= num_objects <= len(OBJECTS):
            raise ValueError(
                f"num_objects must be an int in [1, {len(OBJECTS)}] (the number of objects), "
                f"got {num_objects!r}"
            )
        self.num_objects = int(num_objects)
        if not is_int(num_choices) or not 2 <= num_choices <= len(COLOURS):
            raise ValueError(
                f"num_choices must be an int in [2, {len(COLOURS)}] (the number of colours), "
                f"got {num_choices!r}"
            )
        self.num_choices = int(num_choices)
        needed = self.num_objects * (1 + self.updates)
        self.steps = check_int(
            "steps",
            steps,
            needed,
            f" (num_objects * (1 + updates) = {self.num_objects} * (1 + {self.updates}) "
            "announcements must fit; raise steps or lower num_objects or updates)",
        )
        self.total_steps = self.steps * self.horizon  # steps before the question
        shortest = self.total_steps + 1
        if max_steps is None:
            max_steps = shortest + 3
        self.max_steps = check_int(
            "max_steps",
            max_steps,
            shortest,
            f" (steps * horizon + 1 = {shortest} steps finish an episode)",
        )
        super().__init__(render_mode)

        longest = max(len(f) for f in DISTRACTOR_FACTS) + sum(len(c) + 2 for c in COLOURS)
        self._max_obs_length = longest + 256
        self.observation_space = text_space(self._max_obs_length)
        self.action_space = text_space(64)

        self._phase: Phase = "done"
        self._index = 0
        self._elapsed = 0
        self._target = ""
        self._answer = ""
        self._options: list[str] = []
        self._lines: list[str] = []  # the line of each step before the question
        self._changes: list[tuple[int, str] | None] = []  # (object index, colour) per step
        self._now: list[str] = []  # each object's colour as of the current step
        self._objects: list[str] = []
        self._won = False

    # -- solvers -------------------------------------------------------------------------------

    @staticmethod
    def announcement(line: str) -> tuple[str, str] | None:
        """``(object, colour)`` when ``line`` is one announcement, lower-case; else None.

        Example:
            >>> TrackEnv.announcement("Now the mug is Red."), TrackEnv.announcement("Owls hoot.")
            (('mug', 'red'), None)
        """
        found = _ANNOUNCE_RE.fullmatch(line.strip())
        return (found.group(1).casefold(), found.group(2).casefold()) if found else None

    @staticmethod
    def target_from_text(text: str) -> str | None:
        """The object the last task sentence in ``text`` names, lower-case; else None.

        Example:
            >>> TrackEnv.target_from_text("You will be asked the current colour of the hat.")
            'hat'
        """
        targets = _TARGET_RE.findall(text)
        return targets[-1].casefold() if targets else None

    @staticmethod
    def read_from_text(text: str) -> str | None:
        """The colour of the last announcement about the target visible in ``text`` (the target
        is the object the task sentence names), or None when ``text`` shows none.

        This is the perfect reader: it answers right iff the last target announcement it sees
        is the target's last update.

        Example:
            >>> TrackEnv.read_from_text(
            ...     "asked the current colour of the mug.\\nNow the mug is red.\\n"
            ...     "Now the kite is blue.\\nNow the mug is pink.\\nNow the hat is grey."
            ... )
            'pink'
            >>> TrackEnv.read_from_text("Now the mug is red.") is None  # no target named
            True
        """
        target = TrackEnv.target_from_text(text)
        if target is None:
            return None
        about = [c for o, c in _ANNOUNCE_RE.findall(text) if o.casefold() == target]
        return about[-1].casefold() if about else None

    @staticmethod
    def note_from_text(text: str) -> str:
        """What an expert keeps in its memory from ``text``: the target's last announcement,
        one line ("" when ``text`` shows none).

        Example:
            >>> TrackEnv.note_from_text(
            ...     "the current colour of the mug.\\nNow the mug is red.\\nNow the mug is BLUE."
            ... )
            'Now the mug is blue.'
        """
        colour = TrackEnv.read_from_text(text)
        if colour is None:
            return ""
        return f"Now the {TrackEnv.target_from_text(text)} is {colour}."

    @staticmethod
    def solve_from_text(text: str, options: Sequence[str]) -> str:
        """Answer from the text alone: the option :meth:`read_from_text` names, else
        ``options[0]`` (a guess, right with probability ``1/num_choices``).

        Example:
            >>> text = "the current colour of the hat. Now the hat is red. What colour is it now?"
            >>> TrackEnv.solve_from_text(text, ["blue", "Red"])
            'Red'
            >>> TrackEnv.solve_from_text("What colour is it now?", ["blue", "red"])
            'blue'
        """
        options = list(options)
        if not options:
            raise ValueError("options must be non-empty, got []")
        colour = TrackEnv.read_from_text(text)
        for option in options:
            if normalize_action(option) == colour:
                return option
        return options[0]

    def oracle_action(self) -> str:
        """The right action from the true state: ``"next"``, or the target's current colour at
        the question (``"next"`` after the episode ended)."""
        return self._answer if self._phase == "question" else _NEXT

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng, k = self.np_random, self.num_objects
        self._objects = [OBJECTS[int(i)] for i in rng.choice(len(OBJECTS), k, replace=False)]
        target = int(rng.integers(k))
        self._target = self._objects[target]
        self._changes = self._draw_changes(rng)
        self._lines = self._draw_lines(rng)
        history = [c for obj, c in filter(None, self._changes) if obj == target]
        self._answer = history[-1]
        self._options = self._draw_options(rng, history, target)
        self._now = [""] * k
        self._phase = "step"
        self._index = 0
        self._elapsed = 0
        self._won = False
        self._apply(0)
        self._last_obs = self._observation()
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._elapsed += 1
        choice, reason = self._match(action)
        reward = 0.0
        passes = choice is None and self.invalid_step == "passes" and self._phase != "done"
        if choice is not None or passes:
            self._index += 1
            if self._phase == "question":
                self._won = choice == self._answer
                reward = 1.0 if self._won else 0.0
                self._phase = "done"
            elif self._index >= self.total_steps:
                self._phase = "question"
            else:
                self._apply(self._index)
            self._last_obs = self._observation(answer=choice)
        terminated = self._phase == "done"
        truncated = not terminated and self._elapsed >= self.max_steps
        info = step_info(self._info(), reason if choice is None else None)
        return self._last_obs, reward, terminated, truncated, info

    # -- internals -----------------------------------------------------------------------------

    def _draw_changes(self, rng: np.random.Generator) -> list[tuple[int, str] | None]:
        """Per step: ``(object, colour)`` where a colour is announced, None for a fact.

        The first ``num_objects`` steps announce the objects' first colours (distinct, in a
        random order); ``updates * horizon`` changes per object sit at random later steps.
        """
        k, total = self.num_objects, self.total_steps
        changes: list[tuple[int, str] | None] = [None] * total
        first = rng.choice(len(COLOURS), k, replace=False)
        order = rng.permutation(k)
        for step, obj in enumerate(order):
            changes[step] = (int(obj), COLOURS[int(first[obj])])
        per_object = self.updates * self.horizon
        movers = rng.permutation(np.repeat(np.arange(k), per_object))
        at = np.sort(rng.choice(np.arange(k, total), size=len(movers), replace=False))
        now = [COLOURS[int(i)] for i in first]
        for step, obj in zip(at, movers, strict=True):
            others = [c for c in COLOURS if c != now[obj]]
            now[obj] = others[int(rng.integers(len(others)))]
            changes[int(step)] = (int(obj), now[obj])
        return changes

    def _draw_lines(self, rng: np.random.Generator) -> list[str]:
        """The text of each step: its announcement, or a distractor fact."""
        num_facts = sum(c is None for c in self._changes)
        fact_ids = iter(
            rng.choice(len(DISTRACTOR_FACTS), num_facts, replace=num_facts > len(DISTRACTOR_FACTS))
        )
        return [
            f"Did you know? {DISTRACTOR_FACTS[int(next(fact_ids))]}"
            if change is None
            else f"Now the {self._objects[change[0]]} is {change[1]}."
            for change in self._changes
        ]

    def _draw_options(self, rng: np.random.Generator, history: list[str], target: int) -> list[str]:
        """The answer, the target's previous colour, then the target's other earlier colours and
        the other objects' current colours (in a random order), then any colour: shuffled."""
        answer = history[-1]
        earlier = list(dict.fromkeys(c for c in reversed(history[:-1]) if c != answer))
        final = {obj: c for obj, c in filter(None, self._changes)}
        others = [c for obj, c in final.items() if obj != target]
        rest = list(dict.fromkeys(c for c in [*earlier[1:], *others] if c not in earlier[:1]))
        rest = [c for c in rest if c != answer]
        fill = [c for c in COLOURS if c != answer and c not in earlier[:1] and c not in rest]
        ranked = [*earlier[:1], *(rest[int(i)] for i in rng.permutation(len(rest)))]
        ranked += [fill[int(i)] for i in rng.permutation(len(fill))]
        offered = [answer, *ranked[: self.num_choices - 1]]
        return [offered[int(i)] for i in rng.permutation(len(offered))]

    def _apply(self, index: int) -> None:
        """Step ``index`` is shown: its announcement (if any) is now the object's colour."""
        change = self._changes[index]
        if change is not None:
            self._now[change[0]] = change[1]

    def _admissible(self) -> list[str]:
        if self._phase == "question":
            return list(self._options)
        return [] if self._phase == "done" else [_NEXT]

    def _match(self, action: Any) -> tuple[str | None, str]:
        if self._phase == "done":
            return None, "the episode is over; call reset()"
        return match_action(action, self._admissible())

    def _observation(self, answer: str | None = "") -> str:
        if self._phase == "step":
            text = self._lines[self._index]
            if self._index == 0:
                text = f"{_target_sentence(self._target)}\n{text}"
        elif self._phase == "question":
            text = f"{_QUESTION}\nAnswer with one of: {', '.join(self._options)}."
        elif self._won:
            text = f"Correct: the {self._target} is {self._answer.upper()}."
        elif answer is None:
            text = f"No answer: the {self._target} is {self._answer.upper()}."
        else:
            now = self._answer.upper()
            text = f"Wrong: you answered {answer}, but the {self._target} is {now}."
        return sanitize(text, self._max_obs_length)

    def _info(self) -> dict[str, Any]:
        task = (
            "Memory test: colours are announced and change; say 'next' to move on. "
            f"{_target_sentence(self._target)} Answer with one of the offered options."
        )
        return {
            TASK: task,
            ADMISSIBLE_ACTIONS: self._admissible(),
            WON: self._won,
            STATE_KEY: stable_hash(
                "track", self._phase, self._index, self._target, tuple(self._now)
            ),
        }

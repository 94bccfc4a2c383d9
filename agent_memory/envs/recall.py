"""Recall: a memory probe that only a history window reaching back to the first step can solve.

The episode shows a cue ("Remember this: the key is BLUE."), then ``num_distractors`` steps that
never mention it, then asks "Which colour was the key?" with ``num_choices`` options. An agent that
sees only the current observation guesses; one whose history window still holds the cue answers.
Plotting success against ``history_length`` shows what the window buys. With ``num_cues`` > 1 the
cues (different objects) are spread over the episode and the question asks about one of them, so
a memory must keep every cue, each tied to its object, for as long as the episode runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, Literal

import numpy as np

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
from agent_memory.envs.text_adapter import match_action, normalize_action

__all__ = ["COLOURS", "DISTRACTOR_FACTS", "OBJECTS", "RecallEnv"]

COLOURS: Final[tuple[str, ...]] = (
    "red",
    "blue",
    "green",
    "yellow",
    "purple",
    "orange",
    "white",
    "black",
    "pink",
    "brown",
    "grey",
    "silver",
)
OBJECTS: Final[tuple[str, ...]] = (
    "key",
    "door",
    "box",
    "lamp",
    "kite",
    "car",
    "umbrella",
    "bicycle",
    "mug",
    "hat",
    "balloon",
    "scarf",
)
#: Distractor facts: neutral trivia that names no colour and no object of the vocabulary.
DISTRACTOR_FACTS: Final[tuple[str, ...]] = (
    "Octopuses have three hearts.",
    "A group of owls is called a parliament.",
    "Honey found in ancient tombs can still be eaten.",
    "Bananas are berries, but strawberries are not.",
    "The Eiffel Tower grows a little taller in summer.",
    "Sharks existed before trees did.",
    "A day on Venus is longer than its year.",
    "Wombats leave cube-shaped droppings.",
    "The shortest war in history lasted under an hour.",
    "Sea otters hold hands while they sleep.",
    "There are more possible chess games than atoms in the observable universe.",
    "Butterflies taste with their feet.",
    "A whale's heart can weigh as much as a small piano.",
    "Snails can sleep for up to three years.",
    "A bolt of lightning is about five times hotter than the surface of the Sun.",
    "Some turtles can breathe through their backsides.",
    "Lobsters were once considered a poor man's food.",
    "Cows have best friends and get stressed when apart.",
    "An ostrich's eye is bigger than its brain.",
    "Hot water can freeze faster than cold water.",
    "Koalas sleep up to twenty-two hours a day.",
    "The dot over a lowercase i is called a tittle.",
    "Peanuts are not nuts; they grow underground like beans.",
    "A jiffy is an actual unit of time.",
)
_NEXT: Final = "next"
_CUE_RE: Final = re.compile(r"Remember this: the ([A-Za-z]+) is ([A-Za-z]+)\.", re.IGNORECASE)
_QUESTION_RE: Final = re.compile(r"which colou?r was the ([A-Za-z]+)\?", re.IGNORECASE)
_TASK: Final = (
    "Memory test: remember what you are told, say 'next' to move on, and answer the question at "
    "the end with one of the offered options."
)

Phase = Literal["cue", "distractor", "question", "done"]


class RecallEnv(TextEnv):
    """Cues, ``num_distractors`` distractor steps, then a multiple-choice question about one cue.

    The cue and the trivia admit only ``"next"``; the question admits the shuffled colours, and
    the right one gives reward 1 and ``won``. With one cue (``C = 1``) a window of the last ``k``
    steps reaches it iff ``k >= N + 1`` (or ``k = -1``). An invalid action changes nothing but
    pushes the cue back. With ``C`` cues the first step is a cue and the other ``C - 1`` sit at
    random steps among the next ``C - 1 + N``; each names a different object in its own colour.
    The question asks about one cue, drawn uniformly; its options hold the other cues' colours
    (as many as fit), so a memory that mixes up the objects fails.

    Args:
        num_distractors: Distractor steps among the cues and before the question (``N`` above).
        num_choices: Options at the question (2 .. ``len(COLOURS)``).
        num_cues: Cues per episode (1 .. ``len(OBJECTS)``, ``C`` above).
        max_steps: Steps before truncation; default ``num_cues + num_distractors + 4``.
        answer_format: ``"colour"`` (options ``pink``, ``orange``...) or ``"statement"``
            (``the mug is pink``, ``the mug is orange``...: each option restates the cue it
            claims, so a model can answer by reading back what followed ``the mug is``; the
            question lists only the colours, so that text is the cue's alone).
        render_mode: ``"ansi"`` makes :meth:`render` return the current observation.

    Example:
        >>> env = RecallEnv(num_distractors=2, num_choices=3)
        >>> obs, info = env.reset(seed=0)
        >>> print(obs)
        Remember this: the balloon is ORANGE.
        Say 'next' to continue.
        >>> history = [obs]
        >>> for _ in range(2):
        ...     obs, reward, terminated, truncated, info = env.step("next")
        ...     history.append(obs)
        >>> print(obs)
        Did you know? Hot water can freeze faster than cold water.
        Say 'next' to continue.
        >>> obs, reward, terminated, truncated, info = env.step("next")
        >>> print(obs)
        Question: which colour was the balloon?
        Answer with one of: white, orange, yellow.
        >>> options = info["admissible_actions"]
        >>> RecallEnv.solve_from_text("\\n".join(history[-2:] + [obs]), options)  # window of 2
        'white'
        >>> answer = RecallEnv.solve_from_text("\\n".join(history[-3:] + [obs]), options)
        >>> answer, env.unwrapped.oracle_action()
        ('orange', 'orange')
        >>> obs, reward, terminated, truncated, info = env.step(answer)
        >>> reward, terminated, info["won"]
        (1.0, True, True)

        Several cues, and a question about one of them:

        >>> env = RecallEnv(num_distractors=2, num_choices=3, num_cues=2)
        >>> obs, info = env.reset(seed=4)
        >>> for _ in range(4):
        ...     print(obs.splitlines()[0])
        ...     obs, *_ = env.step("next")
        Remember this: the mug is PINK.
        Did you know? Snails can sleep for up to three years.
        Remember this: the scarf is ORANGE.
        Did you know? An ostrich's eye is bigger than its brain.
        >>> print(obs)
        Question: which colour was the mug?
        Answer with one of: pink, orange, silver.
    """

    def __init__(
        self,
        num_distractors: int = 5,
        num_choices: int = 4,
        num_cues: int = 1,
        max_steps: int | None = None,
        render_mode: Literal["ansi"] | None = None,
        answer_format: Literal["colour", "statement"] = "colour",
    ) -> None:
        self.num_distractors = check_int("num_distractors", num_distractors, 0)
        if (
            isinstance(num_choices, bool)
            or not isinstance(num_choices, int)
            or not 2 <= num_choices <= len(COLOURS)
        ):
            raise ValueError(
                f"num_choices must be an int in [2, {len(COLOURS)}] (the number of colours), "
                f"got {num_choices!r}"
            )
        self.num_choices = num_choices
        if not is_int(num_cues) or not 1 <= num_cues <= len(OBJECTS):
            raise ValueError(
                f"num_cues must be an int in [1, {len(OBJECTS)}] (the number of objects), "
                f"got {num_cues!r}"
            )
        self.num_cues = int(num_cues)
        if answer_format not in ("colour", "statement"):
            raise ValueError(
                f"answer_format must be 'colour' or 'statement', got {answer_format!r}"
            )
        self.answer_format = answer_format
        shortest = self.num_cues + self.num_distractors + 1  # every cue and fact, then the answer
        if max_steps is None:
            max_steps = shortest + 3
        self.max_steps = check_int(
            "max_steps",
            max_steps,
            shortest,
            f" (num_cues + num_distractors + 1 = {shortest} steps finish an episode)",
        )
        super().__init__(render_mode)

        longest = max(len(f) for f in DISTRACTOR_FACTS) + sum(len(c) + 2 for c in COLOURS)
        self._max_obs_length = longest + 256
        self.observation_space = text_space(self._max_obs_length)
        self.action_space = text_space(64)

        self._phase: Phase = "done"
        self._index = 0
        self._elapsed = 0
        self._object = ""  # the object asked about, its colour, and the option that says it
        self._colour = ""
        self._answer = ""
        self._options: list[str] = []
        self._steps: list[str] = []  # the text of each step before the question, cues and facts
        self._cue_steps: frozenset[int] = frozenset()
        self._won = False

    # -- solvers -------------------------------------------------------------------------------

    @staticmethod
    def note_from_text(text: str) -> str:
        """What an expert keeps in its memory from ``text``: each object's latest cue, one per
        line (what :meth:`solve_from_text` answers from).

        Example:
            >>> RecallEnv.note_from_text("Remember this: the hat is RED.\\nSay 'next'.")
            'Remember this: the hat is RED.'
        """
        latest = {
            obj.casefold(): f"Remember this: the {obj} is {colour}."
            for obj, colour in _CUE_RE.findall(text)
        }
        return "\n".join(latest.values())

    @staticmethod
    def solve_from_text(text: str, options: Sequence[str]) -> str:
        """Answer from the text alone: the option named by a cue found in ``text``, else a guess.

        The cue used is the last one about the object asked for (else the last cue); without
        one the guess is ``options[0]``, right with probability ``1/num_choices``.

        Args:
            text: Whatever the agent sees (e.g. the whole prompt with its history window).
            options: The admissible answers.

        Example:
            >>> RecallEnv.solve_from_text("Remember this: the hat is RED. ...", ["blue", "red"])
            'red'
            >>> RecallEnv.solve_from_text("Which colour was the hat?", ["blue", "red"])
            'blue'
        """
        options = list(options)
        if not options:
            raise ValueError("options must be non-empty, got []")
        cues = _CUE_RE.findall(text)
        asked = _QUESTION_RE.findall(text)
        if asked:
            about = [c for c in cues if c[0].casefold() == asked[-1].casefold()]
            cues = about or cues
        if cues:
            colour = cues[-1][1].casefold()
            for option in options:  # a colour, or a statement ending with it
                if normalize_action(option).rpartition(" ")[2] == colour:
                    return option
        return options[0]

    def oracle_action(self) -> str:
        """The right action from the true state: ``"next"``, or the asked colour (its statement
        with ``answer_format="statement"``) at the question.

        After the episode ends no action matters; it returns ``"next"``.
        """
        return self._answer if self._phase == "question" else _NEXT

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        # One cue draws exactly what the single-cue env always drew, in the same order, so its
        # episodes stay the same for every seed; more cues draw more, and only then.
        rng, n, c = self.np_random, self.num_distractors, self.num_cues
        object_ids = [int(rng.integers(len(OBJECTS)))]
        if c > 1:
            rest = [i for i in range(len(OBJECTS)) if i != object_ids[0]]
            object_ids += [rest[int(i)] for i in rng.choice(len(rest), size=c - 1, replace=False)]
        # Distinct colours: the first c are the cues', the rest fill the options.
        colour_ids = [int(i) for i in rng.choice(len(COLOURS), max(c, self.num_choices), False)]
        asked = int(rng.integers(c)) if c > 1 else 0
        self._object, self._colour = OBJECTS[object_ids[asked]], COLOURS[colour_ids[asked]]
        self._options = [self._say(c) for c in self._draw_options(rng, colour_ids, asked)]
        self._answer = self._say(self._colour)
        # The first step is a cue; the others sit at random steps among the next c - 1 + n.
        later = rng.choice(c - 1 + n, size=c - 1, replace=False) if c > 1 else ()
        self._cue_steps = frozenset([0, *(int(i) + 1 for i in later)])
        fact_ids = rng.choice(len(DISTRACTOR_FACTS), size=n, replace=n > len(DISTRACTOR_FACTS))
        cues = iter(
            f"Remember this: the {OBJECTS[o]} is {COLOURS[k].upper()}."
            for o, k in zip(object_ids, colour_ids[:c], strict=True)
        )
        facts = iter(f"Did you know? {DISTRACTOR_FACTS[int(i)]}" for i in fact_ids)
        self._steps = [next(cues if i in self._cue_steps else facts) for i in range(c + n)]
        self._phase = "cue"
        self._index = 0
        self._elapsed = 0
        self._won = False
        self._last_obs = self._observation()
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._elapsed += 1
        choice, reason = self._match(action)
        reward = 0.0
        if choice is not None:
            if self._phase == "question":
                self._won = choice == self._answer
                reward = 1.0 if self._won else 0.0
                self._phase = "done"
                self._index += 1
            else:
                self._index += 1
                self._phase = self._phase_at(self._index)
            self._last_obs = self._observation(answer=choice)
        terminated = self._phase == "done"
        truncated = not terminated and self._elapsed >= self.max_steps
        info = step_info(self._info(), reason if choice is None else None)
        return self._last_obs, reward, terminated, truncated, info

    # -- internals -----------------------------------------------------------------------------

    def _draw_options(
        self, rng: np.random.Generator, colour_ids: list[int], asked: int
    ) -> list[str]:
        """The asked cue's colour, the other cues' (as many as fit), then the remaining colours.

        Shuffled, so the answer's position is uniform; a memory that mixes up the cues finds
        the wrong cue's colour among the options.
        """
        c = self.num_cues
        others = colour_ids[:asked] + colour_ids[asked + 1 : c]
        if len(others) > self.num_choices - 1:  # only with more cues than options
            picked = rng.choice(len(others), size=self.num_choices - 1, replace=False)
            others = [others[int(i)] for i in picked]
        offered = [colour_ids[asked], *others, *colour_ids[c:]]  # exactly num_choices colours
        return [COLOURS[int(i)] for i in rng.permutation(offered)]

    def _say(self, colour: str) -> str:
        """The option that answers ``colour`` (see ``answer_format``)."""
        return colour if self.answer_format == "colour" else f"the {self._object} is {colour}"

    def _phase_at(self, index: int) -> Phase:
        if index >= len(self._steps):
            return "question"
        return "cue" if index in self._cue_steps else "distractor"

    def _admissible(self) -> list[str]:
        if self._phase == "question":
            return list(self._options)
        return [] if self._phase == "done" else [_NEXT]

    def _match(self, action: Any) -> tuple[str | None, str]:
        if self._phase == "done":
            return None, "the episode is over; call reset()"
        return match_action(action, self._admissible())

    def _observation(self, answer: str = "") -> str:
        if self._phase in ("cue", "distractor"):
            text = self._steps[self._index]
        elif self._phase == "question":
            if self.answer_format == "colour":
                offered = f"Answer with one of: {', '.join(self._options)}."
            else:  # the colours only: "the mug is" stays the cue's alone in the text
                colours = [o.rsplit(" ", 1)[-1] for o in self._options]
                offered = (
                    f"Answer with a statement of the {self._object}'s colour, one of: "
                    f"{', '.join(colours)}."
                )
            return sanitize(
                f"Question: which colour was the {self._object}?\n{offered}", self._max_obs_length
            )
        elif self._won:
            return f"Correct: the {self._object} was {self._colour.upper()}."
        else:
            return (
                f"Wrong: you answered {answer}, but the {self._object} was {self._colour.upper()}."
            )
        return sanitize(f"{text}\nSay '{_NEXT}' to continue.", self._max_obs_length)

    def _info(self) -> dict[str, Any]:
        return {
            TASK: _TASK,
            ADMISSIBLE_ACTIONS: self._admissible(),
            WON: self._won,
            STATE_KEY: stable_hash("recall", self._phase, self._index, self._object, self._colour),
        }

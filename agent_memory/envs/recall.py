"""Recall: a memory probe that only a history window reaching back to the first step can solve.

The episode shows a cue ("Remember this: the key is BLUE."), then ``num_distractors`` steps that
never mention it, then asks "Which colour was the key?" with ``num_choices`` options. An agent that
sees only the current observation guesses; one whose history window still holds the cue answers.
Plotting success against ``history_length`` shows what the window buys.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, Literal

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    check_int,
    sanitize,
    stable_hash,
    step_info,
    text_space,
    unknown_action,
)
from agent_memory.envs.text_adapter import normalize_action

__all__ = ["COLOURS", "DISTRACTOR_FACTS", "OBJECTS", "RecallEnv"]

COLOURS: Final[tuple[str, ...]] = (
    "red", "blue", "green", "yellow", "purple", "orange",
    "white", "black", "pink", "brown", "grey", "silver",
)  # fmt: skip
OBJECTS: Final[tuple[str, ...]] = (
    "key", "door", "box", "lamp", "kite", "car",
    "umbrella", "bicycle", "mug", "hat", "balloon", "scarf",
)  # fmt: skip
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
    """A cue, ``num_distractors`` distractor steps, then a multiple-choice question about the cue.

    The cue and the trivia admit only ``"next"``; the question admits the shuffled colours, and
    the right one gives reward 1 and ``won``. A window of the last ``k`` steps reaches the cue iff
    ``k >= N + 1`` (or ``k = -1``). An invalid action changes nothing but pushes the cue back.

    Args:
        num_distractors: Distractor steps between cue and question (``N`` above).
        num_choices: Options at the question (2 .. ``len(COLOURS)``).
        max_steps: Steps before truncation; default ``num_distractors + 5``.
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
    """

    def __init__(
        self,
        num_distractors: int = 5,
        num_choices: int = 4,
        max_steps: int | None = None,
        render_mode: Literal["ansi"] | None = None,
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
        if max_steps is None:
            max_steps = num_distractors + 5
        self.max_steps = check_int(
            "max_steps",
            max_steps,
            num_distractors + 2,
            f" (num_distractors + 2 = {num_distractors + 2} steps finish an episode)",
        )
        super().__init__(render_mode)

        longest = max(len(f) for f in DISTRACTOR_FACTS) + sum(len(c) + 2 for c in COLOURS)
        self._max_obs_length = longest + 256
        self.observation_space = text_space(self._max_obs_length)
        self.action_space = text_space(64)

        self._phase: Phase = "done"
        self._index = 0
        self._elapsed = 0
        self._object = ""
        self._colour = ""
        self._options: list[str] = []
        self._facts: list[str] = []
        self._won = False

    # -- solvers -------------------------------------------------------------------------------

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
            for option in options:
                if normalize_action(option) == colour:
                    return option
        return options[0]

    def oracle_action(self) -> str:
        """The right action from the true state: ``"next"``, or the cue's colour at the question.

        After the episode ends no action matters; it returns ``"next"``.
        """
        return self._colour if self._phase == "question" else _NEXT

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        self._object = OBJECTS[int(rng.integers(len(OBJECTS)))]
        colour_ids = rng.choice(len(COLOURS), size=self.num_choices, replace=False)
        self._colour = COLOURS[int(colour_ids[0])]
        # The answer is drawn first and shuffled in, so its position is uniform.
        self._options = [COLOURS[int(i)] for i in rng.permutation(colour_ids)]
        n = self.num_distractors
        fact_ids = rng.choice(len(DISTRACTOR_FACTS), size=n, replace=n > len(DISTRACTOR_FACTS))
        self._facts = [DISTRACTOR_FACTS[int(i)] for i in fact_ids]
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
                self._won = choice == self._colour
                reward = 1.0 if self._won else 0.0
                self._phase = "done"
                self._index += 1
            else:
                self._index += 1
                self._phase = "distractor" if self._index <= self.num_distractors else "question"
            self._last_obs = self._observation(answer=choice)
        terminated = self._phase == "done"
        truncated = not terminated and self._elapsed >= self.max_steps
        info = step_info(self._info(), reason if choice is None else None)
        return self._last_obs, reward, terminated, truncated, info

    # -- internals -----------------------------------------------------------------------------

    def _admissible(self) -> list[str]:
        if self._phase == "question":
            return list(self._options)
        return [] if self._phase == "done" else [_NEXT]

    def _match(self, action: Any) -> tuple[str | None, str]:
        if self._phase == "done":
            return None, "the episode is over; call reset()"
        if not isinstance(action, str):
            return None, f"action must be a string, got {type(action).__name__}"
        admissible = self._admissible()
        if action in admissible:
            return action, ""
        by_norm = {normalize_action(a): a for a in admissible}
        # Case-folding never shortens text: past the longest name, an action matches none.
        wanted = normalize_action(action, max(map(len, by_norm), default=0) + 1)
        if wanted in by_norm:
            return by_norm[wanted], ""
        return None, unknown_action(action, admissible)

    def _observation(self, answer: str = "") -> str:
        if self._phase == "cue":
            text = f"Remember this: the {self._object} is {self._colour.upper()}."
        elif self._phase == "distractor":
            text = f"Did you know? {self._facts[self._index - 1]}"
        elif self._phase == "question":
            return sanitize(
                f"Question: which colour was the {self._object}?\n"
                f"Answer with one of: {', '.join(self._options)}.",
                self._max_obs_length,
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

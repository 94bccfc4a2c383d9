"""Stop strings of local generation (``policy=hf``): where a row stops, and its text's cut.

A stop string may span tokens, so generation checks each row's newest text after every token
(:func:`stop_criteria`), and the response text ends before the earliest stop string
(:func:`cut_at_stops`) while its ids keep the whole last token.

Example:
    >>> cut_at_stops("go up</action> and more", ["</action>", "\\n"])
    'go up'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["cut_at_stops", "stop_criteria"]


def stop_criteria(tokenizer: Any, stops: list[str], start: int, rows: int) -> Any:
    """A ``StoppingCriteria`` ending each of ``rows`` rows once its new text (the tokens from
    position ``start``) holds one of ``stops``; None without stop strings. Its ``stopped_at``
    holds, per row, the new tokens it had when it stopped (None: it did not).

    Example:
        >>> stop_criteria(None, [], start=3, rows=2) is None
        True
    """
    if not stops:
        return None
    import torch
    from transformers import StoppingCriteria

    # The newest tokens are enough to see a stop string appear (it was absent a step before).
    tail = 2 * max(len(s) for s in stops) + 8

    class StopOnStrings(StoppingCriteria):
        def __init__(self) -> None:
            self.stopped_at: list[int | None] = [None] * rows

        def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> Any:
            n = input_ids.shape[1] - start
            texts = tokenizer.batch_decode(
                input_ids[:, max(start, input_ids.shape[1] - tail) :].tolist(),
                skip_special_tokens=True,
            )
            done = []
            for row, text in enumerate(texts):
                if self.stopped_at[row] is None and any(s in text for s in stops):
                    self.stopped_at[row] = n
                done.append(self.stopped_at[row] is not None)
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StopOnStrings()


def cut_at_stops(text: str, stops: list[str]) -> str:
    """``text`` up to (not including) the earliest of ``stops`` (all of it without one).

    Example:
        >>> cut_at_stops("a;b.c", [".", ";"]), cut_at_stops("abc", ["."])
        ('a', 'abc')
    """
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]

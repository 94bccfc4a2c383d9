"""Whether a run that raised nothing failed: the share of its episodes that failed, against
``rollout.failure_threshold`` (docs/rollouts.md says why its default is 0.1).

A request that fails after its retries ends its episode, so failed requests count as the
episodes they cost; the shares by kind go into ``summary.json`` (``failure_shares``) and the
run's last log line, whatever the verdict.

Example:
    >>> summary = {"episodes": 24, "episodes_planned": 24, "errors": 18,
    ...            "policy_stats": {"prompts": 24, "failures": 18, "malformed_answers": 2}}
    >>> shares = failure_shares(summary, kinds=("malformed_answers",))
    >>> shares["policy_requests"], shares["policy_requests_by_kind"]
    (0.75, {'request_errors': 0.6666666666666666, 'malformed_answers': 0.08333333333333333})
    >>> print(failed_share({**summary, "failure_shares": shares}, 0.1))
    18 of 24 episodes failed (rollout.failure_threshold=0.1); each is in errors.jsonl; 18 of 24 \
policy requests failed (16 request_errors, 2 malformed_answers), each ending its episode
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REQUEST_ERRORS", "failed_share", "failure_kinds", "failure_shares", "shares_text"]

#: The kind of a failed request that no named counter takes: every attempt of it ended in an
#: error (an HTTP error status, a timeout, a lost connection).
REQUEST_ERRORS = "request_errors"


def failure_kinds(stats: Any) -> tuple[str, ...]:
    """The counters of ``stats`` (a policy's) that each name a kind of failed request, all
    also counted in its ``failures`` (the openai client's refused answers); () for none."""
    kinds = getattr(type(stats), "failure_kinds", None)
    return tuple(kinds()) if callable(kinds) else ()


def failure_shares(summary: Mapping[str, Any], kinds: Sequence[str] = ()) -> dict[str, Any]:
    """The shares of what failed: ``episodes`` (``errors`` of ``episodes_planned``), and for a
    policy that counts its requests (``prompts`` and ``failures`` in ``policy_stats``)
    ``policy_requests`` and ``policy_requests_by_kind``: :data:`REQUEST_ERRORS` and each of
    ``kinds``, each a share of all the prompts (they add up to ``policy_requests``)."""
    planned = summary.get("episodes_planned", summary["episodes"])
    shares: dict[str, Any] = {"episodes": _share(summary["errors"], planned)}
    stats = summary.get("policy_stats") or {}
    if "prompts" in stats and "failures" in stats:
        prompts = stats["prompts"]
        shares["policy_requests"] = _share(stats["failures"], prompts)
        shares["policy_requests_by_kind"] = {
            k: _share(n, prompts) for k, n in _kind_counts(stats, kinds).items()
        }
    return shares


def failed_share(
    summary: Mapping[str, Any], threshold: float, listed: str = "each is in errors.jsonl"
) -> str | None:
    """Why a run that raised nothing is a failed run: its episodes failed at ``threshold``'s
    share or more (``rollout.failure_threshold``), with the policy requests that failed, if
    any; None when they did not. ``listed`` says where the failed episodes are named.

    Example:
        >>> failed_share({"episodes": 4, "errors": 1, "episodes_planned": 4}, 0.25)
        '1 of 4 episodes failed (rollout.failure_threshold=0.25); each is in errors.jsonl'
        >>> failed_share({"episodes": 4, "errors": 1, "episodes_planned": 4}, 0.5) is None
        True
    """
    shares = summary.get("failure_shares") or failure_shares(summary)
    if not shares["episodes"] or shares["episodes"] < threshold:
        return None
    planned = summary.get("episodes_planned", summary["episodes"])
    why = (
        f"{summary['errors']} of {planned} episodes failed "
        f"(rollout.failure_threshold={float(threshold)!r}); {listed}"
    )
    if shares.get("policy_requests"):
        stats = summary["policy_stats"]
        why += (
            f"; {stats['failures']} of {stats['prompts']} policy requests failed "
            f"({_kinds(shares, stats)}), each ending its episode"
        )
    return why


def shares_text(summary: Mapping[str, Any]) -> str:
    """Every failure share of ``summary``, for the run's last log line (the kinds of failed
    requests that did not happen left out).

    Example:
        >>> shares_text({"episodes": 6, "episodes_planned": 6, "errors": 2,
        ...              "policy_stats": {"prompts": 24, "failures": 0}})
        'failure shares: episodes 0.333 (2 of 6), policy requests 0 (0 of 24)'
    """
    shares = summary.get("failure_shares") or failure_shares(summary)
    planned = summary.get("episodes_planned", summary["episodes"])
    text = f"failure shares: episodes {shares['episodes']:.3g} ({summary['errors']} of {planned})"
    if "policy_requests" in shares:
        stats = summary["policy_stats"]
        kinds = _kinds(shares, stats)
        text += (
            f", policy requests {shares['policy_requests']:.3g} ({stats['failures']} of "
            f"{stats['prompts']}{': ' + kinds if kinds else ''})"
        )
    return text


def _kind_counts(stats: Mapping[str, Any], kinds: Sequence[str]) -> dict[str, int]:
    """Failed requests by kind: each of ``kinds``, and :data:`REQUEST_ERRORS` the rest."""
    named = {k: int(stats.get(k, 0)) for k in kinds if k != REQUEST_ERRORS}
    return {REQUEST_ERRORS: int(stats["failures"]) - sum(named.values()), **named}


def _kinds(shares: Mapping[str, Any], stats: Mapping[str, Any]) -> str:
    """``"16 request_errors, 2 malformed_answers"``: the kinds of failed request that happened."""
    counts = _kind_counts(stats, list(shares["policy_requests_by_kind"]))
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n)


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0

"""The send-time rule, in pure functions (docs/SEND_TIME.md, "The model"): a 24-hour histogram of a
recipient's local engagement hours, smoothed circularly (each hour + half of each neighbour), its
best hour inside a window, and the deterministic holdout draw. The bulk SQL of
:mod:`notifications.send_time.compute` states the same smoothing (a test holds them equal)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import time

HOURS = 24


def smooth(counts: Sequence[int]) -> list[float]:
    """Each hour's count plus half of each neighbour's, around the clock (23 and 0 are neighbours)."""
    if len(counts) != HOURS:
        raise ValueError(f"a histogram has {HOURS} hours, not {len(counts)}")
    return [counts[h] + 0.5 * (counts[(h - 1) % HOURS] + counts[(h + 1) % HOURS]) for h in range(HOURS)]


def window_hours(start: time, end: time) -> list[int]:
    """The whole hours ``h`` whose ``h:00`` lies in ``[start, end)`` local time, in order from
    ``start``; ``end`` <= ``start`` wraps past midnight (``21:00``–``02:00``: 21 … 01)."""
    first = start.hour + (1 if (start.minute, start.second, start.microsecond) != (0, 0, 0) else 0)
    stop = end.hour + (1 if (end.minute, end.second, end.microsecond) != (0, 0, 0) else 0)
    if (end.hour, end.minute) > (start.hour, start.minute):
        return list(range(first, stop))
    return [h % HOURS for h in range(first, stop + HOURS)]


def best_hour(counts: Sequence[int], hours: Sequence[int] | None = None) -> int | None:
    """The hour with the highest smoothed score among ``hours`` (default: all 24); a tie goes to the
    earlier one in ``hours``' order. ``None`` when ``hours`` is empty."""
    scores = smooth(counts)
    best: int | None = None
    for h in range(HOURS) if hours is None else hours:
        if best is None or scores[h] > scores[best]:
            best = h
    return best


def in_holdout(campaign_id: object, user_id: str, percent: int) -> bool:
    """Whether ``user_id`` is in ``campaign_id``'s holdout of ``percent`` %: a hash of both, so any
    re-run of a fan-out page draws the same members, and a user is not always held out."""
    if percent <= 0:
        return False
    digest = hashlib.blake2b(f"{campaign_id}:{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 < percent * 100

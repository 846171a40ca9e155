"""Pure statistics of a bench run: percentiles, per-second rates, emulator analyses, CPU per message.

Nothing here touches a process, the database or the network, so each function is tested with exact
values in ``tests/test_bench_stats.py``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0–100) with linear interpolation between closest ranks (NumPy's
    default, "type 7"). ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def latency_summary(values_ms: Sequence[float]) -> dict:
    """``{count, p50, p95, p99, max, mean}`` in ms (rounded to 0.1 ms); ``None`` figures when empty."""
    return {
        "count": len(values_ms),
        "p50": _round(percentile(values_ms, 50)),
        "p95": _round(percentile(values_ms, 95)),
        "p99": _round(percentile(values_ms, 99)),
        "max": _round(max(values_ms) if values_ms else None),
        "mean": _round(sum(values_ms) / len(values_ms) if values_ms else None),
    }


def bucket_series(buckets: Iterable[Sequence[int]], start_ms: int, end_ms: int, bucket_ms: int = 1000) -> list[int]:
    """Counts per bucket from the bucket holding ``start_ms`` to the one holding ``end_ms``
    (inclusive), zeros where ``buckets`` (``[[bucket_start_ms, count], …]``) has none.

    Bucket starts are multiples of ``bucket_ms`` since the epoch, as the emulator reports them.
    """
    if end_ms < start_ms:
        return []
    first = start_ms // bucket_ms
    last = end_ms // bucket_ms
    series = [0] * (last - first + 1)
    for bucket_start, count in buckets:
        index = bucket_start // bucket_ms - first
        if 0 <= index < len(series):
            series[index] += count
    return series


def rate_summary(total: int, seconds: float | None, per_second: Sequence[int]) -> dict:
    """Deliveries per second: ``mean`` = total / seconds; ``p50`` = median of the per-second counts
    (the sustained rate, insensitive to the ramp at either end); ``peak`` = the largest second."""
    return {
        "mean": _round(total / seconds if seconds else None),
        "p50": _round(percentile(per_second, 50)),
        "peak": max(per_second) if per_second else None,
    }


def series_from_times(times_ms: Iterable[int], bucket_ms: int = 1000) -> list[list[int]]:
    """``[[bucket_start_ms, count], …]`` sorted by bucket, from individual receipt instants."""
    counts = Counter(t // bucket_ms * bucket_ms for t in times_ms)
    return [[start, counts[start]] for start in sorted(counts)]


def analyze_messages(messages: Iterable[dict], notification_ids: Iterable[str] = (), bucket_ms: int = 1000) -> dict:
    """What the emulator's ``POST /_emulator/analysis`` answers, computed from its message list
    (``GET /_emulator/messages``): the fallback for an emulator without that endpoint.

    Every aggregate covers all messages; ``notification_ids`` only selects whose receipt instants
    ``received_at_ms`` lists (as the endpoint does).
    """
    wanted = set(map(str, notification_ids))
    received: dict[str, list[int]] = {}
    by_provider: Counter[str] = Counter()
    by_account: Counter[str] = Counter()
    per_id: Counter[str] = Counter()
    buckets: dict[str, Counter[int]] = defaultdict(Counter)
    total = 0
    first = last = None
    for m in messages:
        total += 1
        provider, at, nid = m["provider"], m["received_at_ms"], m.get("notification_id")
        by_provider[provider] += 1
        by_account[m.get("account") or ""] += 1
        buckets[provider][at // bucket_ms * bucket_ms] += 1
        first = at if first is None else min(first, at)
        last = at if last is None else max(last, at)
        if nid is not None:
            per_id[nid] += 1
            if nid in wanted:
                received.setdefault(nid, []).append(at)
    repeated = [(nid, n) for nid, n in per_id.items() if n > 1]
    return {
        "total": total,
        "by_provider": dict(by_provider),
        "by_account": dict(by_account),
        "unique_notification_ids": len(per_id),
        "duplicates": {"messages": sum(n - 1 for _, n in repeated), "ids": len(repeated),
                       "examples": [nid for nid, _ in repeated[:20]]},
        "received_at_ms": received,
        "per_bucket": {p: [[b, c[b]] for b in sorted(c)] for p, c in buckets.items()},
        "first_ms": first,
        "last_ms": last,
    }


def subtract_series(total: Sequence[Sequence[int]], part: Sequence[Sequence[int]]) -> list[list[int]]:
    """``total − part`` bucket by bucket (both ``[[bucket_start_ms, count], …]``), empty buckets dropped."""
    out: Counter[int] = Counter({start: count for start, count in total})
    for start, count in part:
        out[start] -= count
    return [[s, out[s]] for s in sorted(out) if out[s] > 0]


def sum_buckets(per_bucket: dict[str, list], providers: Iterable[str] | None = None) -> list[list[int]]:
    """Add the per-provider series of an analysis into one ``[[bucket_start_ms, count], …]``."""
    total: Counter[int] = Counter()
    for provider, series in per_bucket.items():
        if providers is None or provider in providers:
            for start, count in series:
                total[start] += count
    return [[s, total[s]] for s in sorted(total)]


def otp_latencies(accepted: Sequence[dict], received_at_ms: dict[str, list[int]]) -> tuple[list[float], list[str]]:
    """Accept → provider latency (ms) of each accepted OTP, and the ids the provider never saw.

    ``accepted``: ``{"id", "accept_ms", …}`` per OTP (``accept_ms`` = client clock just before the
    POST); the latency uses the provider's first receipt of that id.
    """
    latencies, missing = [], []
    for otp in accepted:
        times = received_at_ms.get(otp["id"])
        if times:
            latencies.append(min(times) - otp["accept_ms"])
        else:
            missing.append(otp["id"])
    return latencies, missing


def cpu_us_per_message(cpu_seconds: dict[str, float], kinds: Iterable[str], messages: int) -> float | None:
    """CPU-µs per message of the given process kinds (``None`` for no messages)."""
    if not messages:
        return None
    return round(sum(cpu_seconds.get(k, 0.0) for k in kinds) * 1e6 / messages, 1)


def growth(first: float | None, last: float | None) -> float | None:
    """Relative change from ``first`` to ``last`` (0.1 = +10 %); ``None`` if unknown."""
    if not first or last is None:
        return None
    return round((last - first) / first, 3)


def cpu_ms_per_notification(cpu: dict[str, float], kinds: Sequence[str], notifications: int) -> dict[str, float | None]:
    """CPU-ms per notification of each kind in ``kinds`` (``cpu``: seconds by kind) and their ``total``;
    all ``None`` when there were none."""
    if not notifications:
        return {"total": None, **{k: None for k in kinds}}
    by_kind = {k: round(1000 * cpu.get(k, 0.0) / notifications, 2) for k in kinds}
    return {"total": round(sum(by_kind.values()), 2), **by_kind}

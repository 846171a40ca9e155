"""What the provider health page shows of each provider's last hour, from the sampler's rows: four
per-minute series for its small charts, a summary that stays with JavaScript off, the breaker's rule
in words (``providers.isolation.limits_for``) and its open spells (docs/OPERATIONS.md, "Provider health
page"). One query: at most :data:`MINUTES` rows per provider, by the ``(provider, minute)`` index.

Counts are delivery attempts (one per notification and try, one per device for push), never HTTP
requests: one SendGrid request carries up to 1,000 emails, each an attempt, and its breaker counts
that request once. The page says so beside the charts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from core import clock
from notifications.health import ERROR_OUTCOMES
from notifications.provider_minutes.models import ProviderMinute
from notifications.provider_minutes.sampler import OPEN_STATES, minute_of, sample_seconds
from providers.isolation import limits_for

MINUTES = 60
#: The small charts, in order: series key → title.
CHARTS = {"attempts": "attempts / min", "error_share": "error share %", "p95_ms": "latency p95 (ms)",
          "breaker": "breaker open"}


def breaker_rule(name: str) -> str:
    """What "open" means for ``name``, from its limits (the breaker's one rule)."""
    lim = limits_for(name)
    return (f"Open: at least {lim.breaker_min_calls} calls in {lim.breaker_window_seconds} s and "
            f"{lim.breaker_failure_rate:.0%} or more of them failed (timeouts, connection errors, 5xx); "
            f"calls then fail fast for {lim.breaker_open_seconds:g} s, then one probe call goes through: "
            "it closes the breaker if it succeeds, opens it again if it fails.")


def _spells(rows: list[dict], since: datetime) -> list[dict]:
    """The open spells the samples saw (by start), those still open or ended since ``since``."""
    spells: dict[datetime, datetime | None] = {}
    for r in rows:
        if r["spell_began"] is not None:
            ended = spells.get(r["spell_began"])
            spells[r["spell_began"]] = r["spell_ended"] or ended
    return [{"began": began, "ended": ended, "seconds": round((ended - began).total_seconds()) if ended else None}
            for began, ended in sorted(spells.items()) if ended is None or ended >= since]


def _open_in(minute: datetime, row: dict | None, spells: list[dict]) -> int | None:
    """1 if the breaker was open at any time in ``minute``, 0 if sampled and not, None: no sample."""
    end = minute + timedelta(minutes=1)
    if any(s["began"] < end and (s["ended"] is None or s["ended"] >= minute) for s in spells):
        return 1
    if row is None or not row["breaker_state"]:
        return None
    return 1 if row["breaker_state"] in OPEN_STATES or row["breaker_opened"] else 0


def _summary(name: str, rows: list[dict], spells: list[dict], last_sample: datetime | None) -> dict:
    attempts = sum(r["requests"] for r in rows)  # the column counts attempts (models.ProviderMinute)
    errors = sum(r["errors"] for r in rows)
    worst = max((r for r in rows if r["latency_p95_ms"] is not None), key=lambda r: r["latency_p95_ms"],
                default=None)
    parts = [f"{attempts:,} attempts", f"error share {errors / attempts:.1%} ({errors:,})" if attempts
             else "error share –",
             f"worst p95 {worst['latency_p95_ms']:,} ms (at {worst['minute']:%H:%M})" if worst else "worst p95 –"]
    if spells:
        texts = [f"{s['began']:%H:%M:%S}–{s['ended']:%H:%M:%S} ({s['seconds']} s)" if s["ended"]
                 else f"{s['began']:%H:%M:%S}, still open" for s in spells]
        parts.append(f"breaker open {len(spells)}×: " + "; ".join(texts))
    elif last_sample is not None:
        parts.append("breaker closed all along")
    return {"text": ", ".join(parts), "attempts": attempts, "errors": errors,
            "worst_p95_ms": worst["latency_p95_ms"] if worst else None, "spells": spells}


def last_hour(names: list[str], now: datetime | None = None) -> dict:
    """Per provider of ``names`` (``providers``): ``{"name", "labels", "attempts", "error_share", "p95_ms",
    "breaker", "summary", "rule"}`` over the :data:`MINUTES` minutes up to ``now``'s (``chart``: the
    series alone, for the page's script); when the newest sample was taken, and whether it is stale
    (older than three sampling intervals: beat or its worker down)."""
    now = now or clock.now()
    first = minute_of(now) - timedelta(minutes=MINUTES - 1)
    fields = ("provider", "minute", "requests", "errors", "latency_p95_ms", "breaker_state", "breaker_opened",
              "spell_began", "spell_ended", "sampled_at")
    by_provider: dict[str, list[dict]] = {name: [] for name in names}
    for row in (ProviderMinute.objects.filter(provider__in=names, minute__gte=first, minute__lte=minute_of(now))
                .order_by("provider", "minute").values(*fields)):
        by_provider[row["provider"]].append(row)
    minutes = [first + timedelta(minutes=k) for k in range(MINUTES)]
    labels = [m.strftime("%H:%M") for m in minutes]
    sampled = [r["sampled_at"] for rows in by_provider.values() for r in rows if r["sampled_at"]]
    last_sample = max(sampled, default=None)
    providers, charts = [], []
    for name, rows in by_provider.items():
        at = {r["minute"]: r for r in rows}
        spells = _spells(rows, first)
        chart = {
            "name": name, "labels": labels,
            "attempts": [at[m]["requests"] if m in at else None for m in minutes],
            "error_share": [round(100 * at[m]["errors"] / at[m]["requests"], 1) if m in at and at[m]["requests"]
                            else None for m in minutes],
            "p95_ms": [at[m]["latency_p95_ms"] if m in at else None for m in minutes],
            "breaker": [_open_in(m, at.get(m), spells) for m in minutes],
        }
        providers.append({**chart, "summary": _summary(name, rows, spells, last_sample), "rule": breaker_rule(name)})
        charts.append(chart)
    return {"providers": providers, "chart": charts, "charts": CHARTS, "last_sample": last_sample,
            "errors": " + ".join(ERROR_OUTCOMES),
            "stale": last_sample is None or (now - last_sample).total_seconds() > 3 * sample_seconds()}

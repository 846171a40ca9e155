"""Isolation under load and provider trouble (docs/ARCHITECTURE.md §8), with shared state in Redis.

Per provider name, shared by every worker through Redis so the limits hold for the whole platform:
a token bucket with a high-tier reserve (:func:`take_tokens`), a circuit breaker
(:func:`breaker_allows`, :func:`record_calls`) and a bulkhead of leased slots
(:func:`acquire_slots`, :func:`release_slots`). Limits come from ``settings.PROVIDER_LIMITS``
(:func:`limits_for`). Every function fails *open* when Redis is unreachable (logged); instants come
from Redis ``TIME``. Rates in messages per second, times in seconds unless the name says ``_ms``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings

from core.redis_client import Round, get_redis, script
from core.vocabulary import TIERS
from providers.isolation_scripts import ACQUIRE, ADMIT, ALLOW, RECORD, RENEW, TAKE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Effective limits of one provider (from ``settings.PROVIDER_LIMITS``).

    Attributes:
        rate_per_s: total budget, messages per second (both tiers).
        high_reserved_per_s: share of ``rate_per_s`` only the high tier may spend.
        burst_seconds: bucket capacity = rate × this (how long a burst at full rate the bucket holds).
        max_concurrency: concurrent calls per tier, ``{"high": n, "standard": n}``.
        breaker_window_seconds / breaker_min_calls / breaker_failure_rate / breaker_open_seconds:
            the circuit breaker (see the module docstring).
    """

    rate_per_s: float
    high_reserved_per_s: float
    burst_seconds: float
    max_concurrency: dict
    breaker_window_seconds: int
    breaker_min_calls: int
    breaker_failure_rate: float
    breaker_open_seconds: float

    @property
    def standard_rate_per_s(self) -> float:
        return max(0.0, self.rate_per_s - self.high_reserved_per_s)


def limits_for(provider: str) -> Limits:
    """``settings.PROVIDER_LIMITS["DEFAULT"]`` updated with ``settings.PROVIDER_LIMITS[provider]``."""
    config = dict(settings.PROVIDER_LIMITS["DEFAULT"])
    config.update(settings.PROVIDER_LIMITS.get(provider, {}))
    rate = float(config["RATE_PER_S"])
    reserved = config.get("HIGH_RESERVED_PER_S")
    if reserved is None:
        reserved = rate * float(config["HIGH_RESERVED_FRACTION"])
    breaker = config["BREAKER"]
    return Limits(
        rate_per_s=rate, high_reserved_per_s=min(rate, float(reserved)),
        burst_seconds=float(config["BURST_SECONDS"]), max_concurrency=dict(config["MAX_CONCURRENCY"]),
        breaker_window_seconds=int(breaker["WINDOW_SECONDS"]), breaker_min_calls=int(breaker["MIN_CALLS"]),
        breaker_failure_rate=float(breaker["FAILURE_RATE"]), breaker_open_seconds=float(breaker["OPEN_SECONDS"]),
    )


# --- token bucket ---------------------------------------------------------------------------------

def take_tokens(provider: str, tier: str, wanted: int, *, partial: bool = True) -> tuple[int, float]:
    """Take up to ``wanted`` tokens (messages) from ``provider``'s budget for ``tier``.

    Returns ``(granted, wait_seconds)``: ``granted`` tokens were taken (``0..wanted``; with
    ``partial=False`` either all or none); ``wait_seconds`` is when more are expected if fewer than
    wanted were granted. Redis unreachable → ``(wanted, 0)`` (fail open, logged).
    """
    if wanted <= 0:
        return 0, 0.0
    keys, args = _take_call(provider, tier, wanted, partial)
    try:
        answer = script(TAKE)(keys=keys, args=args)
    except redis.RedisError as exc:
        log.warning("token bucket for %s skipped, Redis unavailable: %s", provider, exc)
        return wanted, 0.0
    return _tokens(answer, wanted)


def _take_call(provider: str, tier: str, wanted: int, partial: bool) -> tuple[list, list]:
    limits = limits_for(provider)
    capacity = max(1.0, limits.burst_seconds)
    return ([f"bucket:{provider}:high", f"bucket:{provider}:standard"],
            [limits.high_reserved_per_s, max(1.0, limits.high_reserved_per_s * capacity),
             limits.standard_rate_per_s, max(1.0, limits.standard_rate_per_s * capacity),
             int(wanted), "high" if tier == "high" else "standard", "1" if partial else "0"])


def _tokens(answer: list, wanted: int) -> tuple[int, float]:
    granted, wait_ms = int(answer[0]), int(answer[1])
    return granted, (wait_ms / 1000.0 if granted < wanted else 0.0)


# --- circuit breaker ------------------------------------------------------------------------------

@dataclass(frozen=True)
class BreakerVerdict:
    """``allowed``: the call may go ahead; ``probe``: it is the half-open probe (report its outcome
    with ``record_calls(..., probe=True)``); ``retry_in``: seconds until the breaker may let calls
    through again (when not allowed)."""

    allowed: bool
    retry_in: float = 0.0
    probe: bool = False


def breaker_allows(provider: str, *, may_probe: bool = True) -> BreakerVerdict:
    """May we call ``provider`` now? Closed → yes; open → no (``retry_in`` = time left); after the
    open period → half-open: one probe at a time, and only for callers with ``may_probe`` (an OTP
    would rather go to a healthy backup than test a sick primary). Redis unreachable → yes."""
    keys, args = _allow_call(provider, may_probe)
    try:
        answer = script(ALLOW)(keys=keys, args=args)
    except redis.RedisError as exc:
        log.warning("circuit breaker for %s skipped, Redis unavailable: %s", provider, exc)
        return BreakerVerdict(True)
    return _verdict(answer)


def _allow_call(provider: str, may_probe: bool) -> tuple[list, list]:
    lease_ms = int(max(1.0, float(settings.PROVIDER_TIMEOUT_SECONDS)) * 2000)
    return [f"breaker:{provider}", f"breaker:{provider}:probe"], [lease_ms, "1" if may_probe else "0"]


def _verdict(answer: list) -> BreakerVerdict:
    allowed, wait_ms, probe = answer
    return BreakerVerdict(bool(allowed), int(wait_ms) / 1000.0, bool(probe))


def record_calls(provider: str, *, ok: int = 0, failed: int = 0, probe: bool = False) -> str:
    """Report ``ok`` healthy answers and ``failed`` failures (timeout, connection error, 5xx) of
    ``provider``. Returns the breaker state afterwards (``"closed"``, ``"open"``, ``"half_open"``).

    A permanent error about one message (bad number, 4xx) is a healthy answer. 429 counts as
    neither (it is the budget's job). Redis unreachable → ``"closed"``.
    """
    if ok <= 0 and failed <= 0 and not probe:
        return "closed"
    keys, args = _record_call(provider, ok, failed, probe)
    try:
        answer = script(RECORD)(keys=keys, args=args)
    except redis.RedisError as exc:
        answer = exc
    return _state_after(provider, answer)


def queue_record_calls(batch: Round, provider: str, *, ok: int = 0, failed: int = 0, probe: bool = False) -> None:
    """:func:`record_calls` as a command of the caller's ``batch`` (its reading: the state after);
    with nothing to report, no command and ``"closed"``."""
    if ok <= 0 and failed <= 0 and not probe:
        batch.known("closed")
        return
    keys, args = _record_call(provider, ok, failed, probe)
    batch.script(lambda answer: _state_after(provider, answer), RECORD, keys, args)


def _record_call(provider: str, ok: int, failed: int, probe: bool) -> tuple[list, list]:
    limits = limits_for(provider)
    return ([f"breaker:{provider}", f"breaker:{provider}:probe", f"breaker:{provider}:w:"],
            [int(ok), int(failed), limits.breaker_window_seconds, limits.breaker_min_calls,
             limits.breaker_failure_rate, int(limits.breaker_open_seconds * 1000), "1" if probe else "0"])


def _state_after(provider: str, answer) -> str:
    if isinstance(answer, redis.RedisError):
        log.warning("circuit breaker for %s not updated, Redis unavailable: %s", provider, answer)
        return "closed"
    state = answer[0]
    state = state.decode() if isinstance(state, bytes) else str(state)
    if state == "open":
        log.warning("circuit breaker for provider %s is open: failing fast for %.0f s",
                    provider, limits_for(provider).breaker_open_seconds)
    return state


#: The breaker's states as :func:`breaker_state` reports them: ``probe_due`` is an open breaker whose
#: open period is over; it stays ``open`` in Redis until a call asks (ALLOW turns it half-open), so a
#: provider that gets no call (an idle backup) would read "open" for ever.
STATES = ("closed", "open", "probe_due", "half_open")


def breaker_state(provider: str) -> dict:
    """``{"state", "until_ms", "opened", "since_ms", "closed_ms"}`` for admin pages and metrics
    (``closed`` if unknown): ``state`` is the effective one (:data:`STATES`, or ``unknown`` when Redis
    does not answer): ``open`` only while calls fail fast, ``probe_due`` once the open period is over
    (Redis ``TIME``) and no probe has started. ``opened`` counts openings (a failed probe re-opens),
    ``since_ms`` is when the current or last open spell began, ``closed_ms`` when one last closed
    (epoch ms, 0: never)."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.hgetall(f"breaker:{provider}")
        pipe.time()
        raw, (seconds, micros) = pipe.execute()
    except redis.RedisError:
        return {"state": "unknown", "until_ms": 0, "opened": 0, "since_ms": 0, "closed_ms": 0}
    raw = {k.decode(): v.decode() for k, v in raw.items()}

    def ms(key: str) -> int:
        return int(float(raw.get(key, 0) or 0))

    state = raw.get("state", "closed")
    if state == "open" and ms("until") <= int(seconds) * 1000 + int(micros) // 1000:
        state = "probe_due"
    return {"state": state, "until_ms": ms("until"), "opened": ms("opened"),
            "since_ms": ms("since"), "closed_ms": ms("closed_at")}


#: Error codes of a call the isolation refused before making it (breaker open, no bulkhead slot, no
#: budget token; notifications.delivery.routing): no request reached the provider, so it is no
#: provider call: not in its calls, error share or latency (notifications.health.NOT_CALLED_CODES).
REFUSED_CODES = ("circuit_open", "bulkhead_full", "budget_exhausted")


def is_failure(exc: BaseException) -> bool:
    """Does this error count against the provider's health? Timeouts, connection errors and 5xx do;
    429 (our budget's job), 4xx and configuration errors do not."""
    from providers.base import TransientProviderError

    if not isinstance(exc, TransientProviderError):
        return False
    status = getattr(exc, "http_status", None)
    return status != 429 and exc.code not in ("429", "20429", "QUOTA_EXCEEDED", *REFUSED_CODES)


# --- bulkhead -------------------------------------------------------------------------------------

def acquire_slots(provider: str, tier: str, wanted: int, lease_seconds: float) -> list[str]:
    """Take up to ``wanted`` of ``provider``'s concurrent-call slots for ``tier``.

    Returns the slot ids granted (possibly none); give them back with :func:`release_slots`. A slot
    not released expires after ``lease_seconds``. Redis unreachable → ``wanted`` local ids.
    """
    keys, args = _acquire_call(provider, tier, wanted, lease_seconds)
    try:
        ids = script(ACQUIRE)(keys=keys, args=args)
    except redis.RedisError as exc:
        log.warning("bulkhead for %s skipped, Redis unavailable: %s", provider, exc)
        return _local_slots(args[3], wanted)
    return _slots(ids)


def _acquire_call(provider: str, tier: str, wanted: int, lease_seconds: float) -> tuple[list, list]:
    limit = int(limits_for(provider).max_concurrency.get(tier, 1))
    return [f"bulkhead:{provider}:{tier}"], [int(wanted), limit, int(lease_seconds * 1000), uuid.uuid4().hex]


def _slots(ids: list) -> list[str]:
    return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]


def _local_slots(prefix: str, wanted: int) -> list[str]:
    return [f"{prefix}:{i}" for i in range(wanted)]


@dataclass(frozen=True)
class Admission:
    """:func:`admit_call`'s answer: the breaker's ``verdict``; the bulkhead ``slots`` taken (none
    when the breaker said no); ``tokens`` taken at once and, when fewer than wanted, ``wait`` (s)
    until more are expected (both 0 when no slot was taken)."""

    verdict: BreakerVerdict
    slots: list[str]
    tokens: int
    wait: float


def admit_call(provider: str, tier: str, slots: int, tokens: int, lease_seconds: float, *,
               may_probe: bool) -> Admission:
    """:func:`breaker_allows`, then (allowed) :func:`acquire_slots`, then (slots taken) a first
    :func:`take_tokens` of all ``tokens`` or none, in one script call: the same rules, keys and
    arguments as the three calls, one round trip instead of three. Redis unreachable → each part
    fails open as its function does (allowed, local slot ids, the tokens granted)."""
    allow_keys, allow_args = _allow_call(provider, may_probe)
    acquire_keys, acquire_args = _acquire_call(provider, tier, slots, lease_seconds)
    take_keys, take_args = _take_call(provider, tier, tokens, False)
    try:
        verdict, ids, taken = script(ADMIT)(keys=[*allow_keys, *acquire_keys, *take_keys],
                                             args=[*allow_args, *acquire_args, *take_args])
    except redis.RedisError as exc:
        log.warning("circuit breaker, bulkhead and token bucket for %s skipped, Redis unavailable: %s", provider, exc)
        return Admission(BreakerVerdict(True), _local_slots(acquire_args[3], slots), tokens, 0.0)
    granted, wait = _tokens(taken, tokens) if ids else (0, 0.0)
    return Admission(_verdict(verdict), _slots(ids), granted, wait)


def release_slots(provider: str, tier: str, slots: list[str]) -> None:
    """Give back slots taken with :func:`acquire_slots` (errors are logged, the lease expires)."""
    if not slots:
        return
    try:
        get_redis().zrem(f"bulkhead:{provider}:{tier}", *slots)
    except redis.RedisError as exc:
        _not_released(provider, exc)


def queue_release_slots(batch: Round, provider: str, tier: str, slots: list[str]) -> None:
    """:func:`release_slots` as a command of the caller's ``batch`` (reading: ``None``)."""
    if not slots:
        batch.known(None)
    else:
        batch.call(lambda answer: _not_released(provider, answer) if isinstance(answer, redis.RedisError) else None,
                   "ZREM", f"bulkhead:{provider}:{tier}", *slots)


def _not_released(provider: str, exc: Exception) -> None:
    log.warning("bulkhead slots for %s not released (they expire): %s", provider, exc)


def renew_slots(provider: str, tier: str, slots: list[str], lease_seconds: float) -> None:
    """Make the slots taken with :func:`acquire_slots` (still held) expire ``lease_seconds`` from
    now: a sliding window of calls holds its slots for as long as it runs (errors are logged)."""
    if not slots:
        return
    try:
        script(RENEW)(keys=[f"bulkhead:{provider}:{tier}"], args=[*slots, int(lease_seconds * 1000)])
    except redis.RedisError as exc:
        log.warning("bulkhead slots for %s not renewed: %s", provider, exc)


def slots_in_use(provider: str, tier: str) -> int:
    """Concurrent calls currently holding a slot (expired leases not counted)."""
    import time

    try:
        return int(get_redis().zcount(f"bulkhead:{provider}:{tier}", int(time.time() * 1000), "+inf"))
    except redis.RedisError:
        return 0


def check_isolation_settings() -> list[str]:
    """Problems with ``settings.PROVIDER_LIMITS`` (rates, reserved high share, bursts, bulkheads,
    breakers) of every configured provider, each naming the setting and the rule (empty when all is
    well). The pipeline's own settings (batch sizes, concurrency, lease) are checked by the
    notifications app (``notifications.apps.check_pipeline_settings``)."""
    problems: list[str] = []
    names = {e.get("NAME") for entries in (getattr(settings, "PROVIDERS", None) or {}).values()
             for e in entries if isinstance(e, dict)}
    for name in sorted(n for n in names if n):
        try:
            limits = limits_for(name)
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f'PROVIDER_LIMITS for "{name}": incomplete or not a number ({exc})')
            continue
        where = f'PROVIDER_LIMITS["{name}"]'
        if limits.rate_per_s <= 0:
            problems.append(f"{where} RATE_PER_S (PROVIDER_RATE_PER_S) must be > 0 messages/s, "
                            f"got {limits.rate_per_s:g}")
        config = {**settings.PROVIDER_LIMITS["DEFAULT"], **settings.PROVIDER_LIMITS.get(name, {})}
        fraction = config.get("HIGH_RESERVED_FRACTION")
        if config.get("HIGH_RESERVED_PER_S") is None and not 0 <= float(fraction) < 1:  # type: ignore[arg-type]
            problems.append(f"{where} HIGH_RESERVED_FRACTION (PROVIDER_HIGH_RESERVED_FRACTION) must be in "
                            f"[0, 1): standard traffic needs a share, got {fraction}")
        elif limits.rate_per_s > 0 and not 0 <= limits.high_reserved_per_s < limits.rate_per_s:
            problems.append(f"{where} HIGH_RESERVED_PER_S must be in [0, RATE_PER_S), got "
                            f"{limits.high_reserved_per_s:g}")
        if limits.burst_seconds <= 0:
            problems.append(f"{where} BURST_SECONDS must be > 0, got {limits.burst_seconds:g}")
        for tier in TIERS:
            if int(limits.max_concurrency.get(tier, 0)) < 1:
                problems.append(f"{where} MAX_CONCURRENCY[{tier!r}] (BULKHEAD_{tier.upper()}) must be >= 1, "
                                f"got {limits.max_concurrency.get(tier)}")
        if limits.breaker_window_seconds < 1:
            problems.append(f"{where} BREAKER WINDOW_SECONDS must be >= 1, got {limits.breaker_window_seconds}")
        if limits.breaker_min_calls < 1:
            problems.append(f"{where} BREAKER MIN_CALLS must be >= 1, got {limits.breaker_min_calls}")
        if not 0 < limits.breaker_failure_rate <= 1:
            problems.append(f"{where} BREAKER FAILURE_RATE must be in (0, 1], got {limits.breaker_failure_rate:g}")
        if limits.breaker_open_seconds <= 0:
            problems.append(f"{where} BREAKER OPEN_SECONDS must be > 0, got {limits.breaker_open_seconds:g}")
    return problems

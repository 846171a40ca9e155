"""Calls stage of the delivery pipeline: the provider calls of one channel's batch,
``backend.send_batch(messages, concurrency, gate=, on_result=)`` per grant of budget and bulkhead
slots (SendGrid: up to 1,000 recipients per request; Twilio and FCM: a sliding window of
``SEND_CONCURRENCY`` calls in flight).

:func:`call_standard` uses the primary provider only and leaves the rest of the batch waiting when
its breaker is open or budget does not come; rows whose calls ended are handed to ``settle`` while
the rest are in flight, which bounds a killed worker's duplicates. :func:`call_high` sends one row
with failover to the next provider at once. No call outlives its row's lease (:func:`claim.covers_call`).
Why and in full: docs/ARCHITECTURE.md §6 (steps 6–7) and §8.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from core import clock
from core.redis_client import Round
from notifications import metrics
from notifications import sent_markers as markers
from notifications.delivery.claim import call_deadline_seconds, covers_call, still_ours
from notifications.delivery.routing import route_for
from notifications.models import Notification
from preferences.models import Device, Recipient
from providers import isolation
from providers.base import (
    CallSkipped,
    OutboundMessage,
    ProviderConfigurationError,
    ProviderError,
    SendResult,
    TransientProviderError,
)
from providers.registry import get_backend

log = logging.getLogger(__name__)

#: SendGrid v3 mail/send: recipients per request (one send_batch call is one request).
MAX_PER_REQUEST = 1000

#: How often (seconds) the worker's thread looks for ended calls while a window runs.
_POLL_SECONDS = 0.01

#: ``settle(row_ids, calls)``: record these rows now (all their calls have ended; ``calls`` is the
#: batch's :class:`Calls` so far).
Settle = Callable[[list, "Calls"], None]


@dataclass
class Item:
    """One provider call to make: the row, its push device (or None) and the message."""

    row: Notification
    device: Device | None
    message: OutboundMessage


@dataclass
class Calls:
    """What the calls stage did for a batch: ``outcomes[i]`` the ``(SendResult or error, latency
    ms, end of the call (UTC))`` of every call of item ``i`` (the high tier may call several
    providers); ``lost``: ids of rows that changed hands (or whose lease no longer covered a call)
    before a call; ``waiting``: ``(until, detail)`` when the rest of the batch must wait;
    ``no_call``: row id → the error that prevented any call (high tier); ``settled``: rows the
    ``settle`` callback recorded already; ``marked``: rows whose sent marker was written as their
    call was accepted (the record stage does not write it again)."""

    outcomes: dict[int, list] = field(default_factory=dict)
    lost: set = field(default_factory=set)
    waiting: tuple[datetime, str] | None = None
    no_call: dict = field(default_factory=dict)
    settled: set = field(default_factory=set)  # row ids already recorded while calls were in flight
    marked: set = field(default_factory=set)  # row ids whose sent marker was written at accept


def call_standard(channel: str, name: str, items: list[Item], settle: Settle | None = None) -> Calls:
    """Send every item through the primary ``name`` as budget, breaker and bulkhead allow; rows
    whose calls have all ended go to ``settle`` as they do (see the module docstring)."""
    done = Calls()
    backend = get_backend(channel, name)
    batch_api = getattr(backend, "batch_api", False)
    concurrency = max(1, int(settings.NOTIFY["SEND_CONCURRENCY"][channel]))
    call_lease = call_deadline_seconds()
    deadline = time.monotonic() + float(settings.NOTIFY["BATCH_MAX_WAIT_SECONDS"])
    pending = list(range(len(items)))
    tracker = _Tracker(items, done, settle)
    budget_waited = 0.0
    while pending:
        verdict = isolation.breaker_allows(name)
        if not verdict.allowed:
            metrics.isolation_event("breaker_fast_fail", name, "standard")
            until = clock.now() + timedelta(seconds=max(1.0, verdict.retry_in))
            done.waiting = until, f"{name} unavailable (circuit breaker open); waiting until {until.isoformat()}"
            break
        if time.monotonic() > deadline:
            until = clock.now() + timedelta(seconds=5)
            done.waiting = until, (f"no {name} budget or call slot for {settings.NOTIFY['BATCH_MAX_WAIT_SECONDS']} s; "
                                   f"waiting until {until.isoformat()}")
            break
        slots = isolation.acquire_slots(name, "standard", 1 if batch_api else concurrency, call_lease)
        if not slots:
            metrics.isolation_event("bulkhead_full", name, "standard")
            time.sleep(0.05)
            continue
        want = 1 if verdict.probe else min(len(pending), MAX_PER_REQUEST) if batch_api else len(pending)
        granted, wait = isolation.take_tokens(name, "standard", want)
        if not granted:
            isolation.release_slots(name, "standard", slots)
            pause = min(max(wait, 0.01), 1.0, max(0.0, deadline - time.monotonic()) + 0.01)
            time.sleep(pause)
            budget_waited += pause
            continue
        chunk, pending = pending[:granted], pending[granted:]
        # Budget and slots can take a while on a loaded machine: the chunk's leases must cover the
        # call from here (no call outlives its row's lease).
        chunk = _owned(items, chunk, call_lease, done)
        if not chunk:
            isolation.release_slots(name, "standard", slots)
            continue
        try:
            stopped = _send(backend, items, chunk, min(len(slots), len(chunk)), done, tracker,
                            stop_after=None if batch_api or verdict.probe else len(slots),
                            slots=(name, slots, call_lease))
        finally:
            isolation.release_slots(name, "standard", slots)
        pending = stopped + pending  # not called because the window stopped: still to send
        called = [i for i in chunk if i not in stopped and i in done.outcomes]
        latest = [done.outcomes[i][-1][0] for i in called]
        _count_calls(name, latest, batch_api, verdict.probe)
        limited = [o for o in latest if rate_limited(o)]
        if limited and pending:
            # The provider says we are over its limit: the rest of the batch waits for the time it
            # asked (Retry-After), without spending an attempt, instead of meeting the same 429.
            pause = max([1.0] + [float(o.retry_after or 0) for o in limited])
            until = clock.now() + timedelta(seconds=pause)
            done.waiting = until, f"{name} rate limit (429); waiting until {until.isoformat()}"
            break
    if budget_waited:
        metrics.isolation_event("budget_wait", name, "standard", seconds=budget_waited)
    return done


def call_high(n: Notification, items: list[Item]) -> Calls:
    """Send the items of the high-tier row ``n`` through the provider the failover policy picks,
    then through the next while a provider fails and nothing was accepted."""
    done = Calls()
    tried: list[str] = []
    indexes = list(range(len(items)))
    while True:
        try:
            route = route_for(n, len(items), exclude=tried)
        except (ProviderError, ProviderConfigurationError) as exc:
            if not done.outcomes:
                # No provider may be called now (breaker open, budget or bulkhead exhausted,
                # misconfigured): an attempt that made no call, retried like any transient error.
                done.no_call[n.pk] = exc
            return done
        if tried and _erased_since_loaded(n):
            return done  # erased while the first provider failed: its retry's checks cancel it
        tried.append(route.name)
        called = False
        try:
            owned = _owned(items, indexes, call_deadline_seconds() * len(items), done)
            if not owned:
                return done  # the reconciler took it over: never call for a row that is not ours
            _send(route.backend, items, owned, len(route.slots), done)
            called = True
        finally:
            if not called:
                isolation.release_slots(route.name, "high", route.slots)
        latest = [done.outcomes[i][-1][0] for i in owned]
        # One round trip after the call: its slot back, the breaker's counts, and the sent marker as
        # soon as the provider accepted (before the record, as a standard window does).
        after = Round()
        isolation.queue_release_slots(after, route.name, "high", route.slots)
        failed = _count_calls(route.name, latest, getattr(route.backend, "batch_api", False), route.probe, after)
        marked = {items[i].row.pk for i, o in zip(owned, latest, strict=True) if isinstance(o, SendResult)}
        markers.queue_mark_sent(after, marked)
        _released, state, _marked = after.send()
        breaker_after(route.name, state)
        done.marked.update(marked)
        accepted = any(not isinstance(o, Exception) for o in latest)
        # A transient answer (5xx, timeout, and also a 429: this account's limit, not the backup's)
        # sends the OTP to the next provider at once; a bad number or a misconfiguration does not.
        if accepted or not (failed or any(isinstance(o, TransientProviderError) for o in latest)):
            return done


def _erased_since_loaded(n: Notification) -> bool:
    """Whether ``n``'s recipient was erased after ``n`` was made, read now (the row's recipient was
    loaded before the first call): a failover never sends the erased user's content (one query, only
    on a failover)."""
    erased_at = Recipient.objects.filter(pk=n.recipient_id).values_list("erased_at", flat=True).first()
    return Recipient(erased_at=erased_at).erased_after(n.created_at)


def _owned(items: list[Item], chunk: list[int], seconds: float, done: Calls) -> list[int]:
    """``chunk`` without the items of rows that are no longer ours, after making the leases of the
    rest cover ``seconds`` more."""
    rows = {str(items[i].row.pk) for i in chunk}
    owned = still_ours(rows, seconds)
    done.lost.update(items[i].row.pk for i in chunk if str(items[i].row.pk) not in owned)
    return [i for i in chunk if str(items[i].row.pk) in owned]


class _Tracker:
    """Which rows of a batch have had all their calls end, and handing them to ``settle`` every
    ``RECORD_EVERY_ROWS`` rows or ``RECORD_EVERY_SECONDS`` (in the worker's thread, while the rest
    of the window is in flight)."""

    def __init__(self, items: list[Item], done: Calls, settle: Settle | None) -> None:
        self.done = done
        self.settle = settle
        self.planned: dict = {}
        for item in items:
            self.planned[item.row.pk] = self.planned.get(item.row.pk, 0) + 1
        self.ended: dict = {}
        self.ready: list = []
        self.first_ready = 0.0
        self.every_rows = int(settings.NOTIFY["RECORD_EVERY_ROWS"])
        self.every_seconds = float(settings.NOTIFY["RECORD_EVERY_SECONDS"])

    def ended_call(self, item: Item) -> None:
        pk = item.row.pk
        self.ended[pk] = self.ended.get(pk, 0) + 1
        if self.settle is not None and self.ended[pk] == self.planned[pk] and pk not in self.done.lost:
            if not self.ready:
                self.first_ready = time.monotonic()
            self.ready.append(pk)

    def due(self) -> bool:
        return bool(self.ready) and (len(self.ready) >= self.every_rows
                                     or time.monotonic() - self.first_ready >= self.every_seconds)

    def flush(self) -> None:
        ready, self.ready = self.ready, []
        if not ready or self.settle is None:
            return
        try:
            self.settle(ready, self.done)
        except Exception:
            # Recording failed (the database went away): these rows are recorded with the rest of
            # the batch at its end, or their leases run out and they are re-driven.
            log.exception("recording %d row(s) while their batch was in flight failed; retried at its end",
                          len(ready))
            self.settle = None
            return
        self.done.settled.update(ready)


def _send(backend, items: list[Item], chunk: list[int], concurrency: int, done: Calls,
          tracker: _Tracker | None = None, *, stop_after: int | None = None,
          slots: tuple[str, list, float] | None = None) -> list[int]:
    """One ``send_batch`` for the items ``chunk``, at most ``concurrency`` calls in flight, each
    call gated on its row's lease (:func:`claim.covers_call`). With ``stop_after``, the window
    starts no new call once a call was rate limited or ``stop_after`` calls failed. With a
    ``tracker`` the calls run on a helper thread while this one records rows as they complete
    (and renews the bulkhead ``slots``: ``(provider, ids, lease seconds)``).

    Returns the indexes not called because the window stopped (still to send)."""
    stop = {"failed": 0, "limited": False}
    stopped: list[int] = []
    # Appended on the loop thread, drained here every few ms (no wake-up per call: a queue's
    # put/get pair per message cost a GIL hand-off each).
    results: collections.deque = collections.deque()

    def gate(pos: int) -> bool:  # on the provider event loop
        if stop["limited"] or (stop_after is not None and stop["failed"] >= stop_after):
            stopped.append(chunk[pos])
            return False
        return covers_call(items[chunk[pos]].row.pk)

    def on_result(pos: int, outcome, latency_ms: int) -> None:  # on the provider event loop
        if stop_after is not None:
            if rate_limited(outcome):
                stop["limited"] = True
            elif isinstance(outcome, Exception) and isolation.is_failure(outcome):
                stop["failed"] += 1
        results.append((pos, outcome, latency_ms, clock.now()))

    messages = [items[i].message for i in chunk]
    heard: set[int] = set()
    if tracker is None or tracker.settle is None:
        outcomes = backend.send_batch(messages, concurrency=max(1, concurrency), gate=gate, on_result=on_result)
    else:
        future = _runner().submit(backend.send_batch, messages, max(1, concurrency), gate=gate, on_result=on_result)
        renewed = time.monotonic()
        while True:
            finished = future.done()  # every append happens before the future is done
            accepted = []
            while results:
                result = results.popleft()
                heard.add(_take(result, chunk, items, done, tracker))
                if isinstance(result[1], SendResult):
                    accepted.append(items[chunk[result[0]]].row.pk)
            # The sent marker as soon as the provider accepted, before the row is recorded: a worker
            # killed (or cut off from Postgres) before its record leaves the marker, and the row's
            # next attempt finds it instead of sending again.
            markers.mark_sent(accepted)
            done.marked.update(accepted)
            if finished:
                break
            if tracker.due():
                tracker.flush()
            if slots is not None and time.monotonic() - renewed > slots[2] / 3:
                isolation.renew_slots(slots[0], "standard", slots[1], slots[2])
                renewed = time.monotonic()
            concurrent.futures.wait([future], timeout=_POLL_SECONDS)
        outcomes = future.result()
    while results:
        heard.add(_take(results.popleft(), chunk, items, done, tracker))
    ended = clock.now()
    for pos, outcome in enumerate(outcomes):
        index = chunk[pos]
        if isinstance(outcome, CallSkipped):
            if index not in stopped:
                done.lost.add(items[index].row.pk)  # its lease no longer covered a call: not ours to send
            continue
        if pos not in heard:
            # Not heard through on_result (a batch answered as a whole, e.g. the backstop timeout).
            done.outcomes.setdefault(index, []).append((outcome, 0, ended))
            if tracker is not None:
                tracker.ended_call(items[index])
    if tracker is not None and tracker.due():
        tracker.flush()
    return sorted(set(stopped))


def _take(result: tuple, chunk: list[int], items: list[Item], done: Calls, tracker: _Tracker | None) -> int:
    """Note one outcome heard from the window; returns its position in ``chunk``."""
    pos, outcome, latency_ms, ended = result
    index = chunk[pos]
    done.outcomes.setdefault(index, []).append((outcome, latency_ms, ended))
    if tracker is not None:
        tracker.ended_call(items[index])
    return pos


_runners: dict[int, ThreadPoolExecutor] = {}


def _runner() -> ThreadPoolExecutor:
    """This process's threads that run a window's ``send_batch`` while the worker's thread records
    (created after a fork: a pool's threads do not survive one)."""
    pid = os.getpid()
    if pid not in _runners:
        _runners[pid] = ThreadPoolExecutor(max_workers=16, thread_name_prefix="provider-calls")
    return _runners[pid]


def rate_limited(outcome) -> bool:
    """Is ``outcome`` the provider's "too many requests" (HTTP 429, Twilio 20429, FCM
    QUOTA_EXCEEDED)? Such an answer is about the account's rate, not about the message."""
    return isinstance(outcome, TransientProviderError) and (
        getattr(outcome, "http_status", None) == 429 or outcome.code in ("429", "20429", "QUOTA_EXCEEDED"))


def _count_calls(name: str, outcomes: list, batch_api: bool, probe: bool, batch: Round | None = None) -> int:
    """Feed the breaker of ``name``: requests, not recipients, for a batch API (now, or as a command
    of ``batch``, whose reading is the state after). Returns the calls that failed in a way that
    counts against the provider's health."""
    failed = sum(1 for o in outcomes if isinstance(o, Exception) and isolation.is_failure(o))
    # A 429 is neither (isolation.record_calls): counted healthy, a provider answering 503 below its
    # rate and 429 above it never opened its breaker (hadv27: ok 98, failed 15 a second). A probe
    # answered 429 is an answer: it still closes the breaker.
    limited = 0 if probe else sum(1 for o in outcomes if rate_limited(o))
    if batch_api:
        ok, bad = (0, 1) if failed else (0, 0) if outcomes and limited == len(outcomes) else (1, 0)
    else:
        ok, bad = len(outcomes) - failed - limited, failed
    if batch is None:
        breaker_after(name, isolation.record_calls(name, ok=ok, failed=bad, probe=probe))
    else:
        isolation.queue_record_calls(batch, name, ok=ok, failed=bad, probe=probe)
    return failed


def breaker_after(name: str, state: str) -> None:
    """The breaker's state after counting calls of ``name``: the metric when it opened."""
    if state == "open":
        metrics.isolation_event("breaker_opened", name)

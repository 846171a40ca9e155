"""The delivery pipeline, one for both tiers: claim → load → checks → caps → routing → calls (or
inbox, for ``in_app``) → outcomes → record, one module each (docs/ARCHITECTURE.md §6).

:func:`send_notifications` is what a worker runs for a list of notification ids taken from a
``{tier}.{channel}`` queue. It is safe to run twice for the same ids, concurrently or not: the claim
lets exactly one worker proceed, and the sent marker guards the window after a provider accepted.
A high-tier row is a batch of one with the failover policy. No "claimed" marker is taken before the
call: delivery stays at-least-once (docs/ARCHITECTURE.md §6, step 5).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable

from core import clock
from core.redaction import sensitive_content
from notifications.admission import SendLimits
from notifications.content_limits import rendered_problem
from notifications.delivery import caps, checks, claim, load, record
from notifications.delivery.calls import Calls, Item, call_high, call_standard
from notifications.delivery.checks import Facts
from notifications.delivery.content import Content, ContentError
from notifications.delivery.inbox import call_inbox, refresh_after
from notifications.delivery.outcomes import RESEND_AFTER_UNKNOWN, AttemptRow, Unexpected, attempt_row, decide
from notifications.delivery.routing import primary
from notifications.delivery.types import Call, Decided, Row
from notifications.models import DeliveryAttempt, Notification, Reason, Status
from preferences.models import Device
from providers.base import ProviderConfigurationError
from providers.registry import unavailable_channel_problem

log = logging.getLogger(__name__)
Outcome = DeliveryAttempt.Outcome


def send_notifications(ids: Iterable[str]) -> None:
    """Deliver the given notifications (one worker task's worth). Never raises for provider errors;
    every outcome is recorded on the rows. A crash (a bug, an unreachable database) leaves the rows
    ``sending``: the reconciler re-drives them when their lease runs out."""
    claimed = claim.claim(ids, clock.now())
    if not claimed:
        return
    try:
        already_sent = claim.sent_markers(claimed)
        rows = load.rows(claimed)
        # Whatever is logged while these rows are handled (tracebacks included) never shows the
        # content of the sensitive ones (core/redaction.py).
        with sensitive_content(n for n in rows if n.sensitive):
            content = Content()
            batches: dict[tuple, list] = defaultdict(list)
            for n in rows:
                batches[(n.priority == "high", n.channel)].append(n)
            for (high, channel), batch in batches.items():
                for part in ([[n] for n in batch] if high else [batch]):  # high tier: batches of one
                    try:
                        deliver(channel, part, already_sent, content)
                    except Exception:
                        log.exception("delivery of %d %s notification(s) crashed; their leases will expire and "
                                      "they will be retried", len(part), channel)
    finally:
        claim.release(claimed)


def deliver(channel: str, batch: list[Notification], already_sent: set[str], content: Content) -> None:
    """Stages load → record for claimed rows of one channel and one tier (high: one row)."""
    stopped = load.stopped_phones(batch) if channel == "sms" else None
    devices = load.devices(batch) if channel == "push" else None
    content.types.prime(batch)
    limits = SendLimits()
    ready: list[Row] = []
    for n in batch:
        try:
            row = prepare(n, already_sent, content, stopped,
                          devices.get(n.recipient_id, []) if devices is not None else None, limits)
        except Exception as exc:
            record.worker_error(n, exc)
            continue
        if row is not None:
            ready.append(row)
    ready = caps.admit(ready, content.types.type_of, clock.now())
    if not ready:
        return
    items = [Item(row.n, d, load.message_for(row, to, d.platform if d is not None else None))
             for row in ready for to, d in _targets(row)]
    tier = ready[0].n.priority
    if channel == "in_app":
        # No provider: the call is the write to the users' inboxes (inbox.py), accepted at once.
        done, written = call_inbox(items)
        _record(_decisions(ready, items, done), channel, tier, done.marked)
        refresh_after(written)
        return
    name = primary(channel)
    if name is None:
        # The channel has no provider (an empty *_PROVIDERS list): each row that passed its checks
        # is a dead letter saying why, rather than a crash retried forever.
        error = ProviderConfigurationError(channel, unavailable_channel_problem(channel), code="not_configured")
        done = Calls(no_call={row.n.pk: error for row in ready})
    elif tier == "high":
        done = call_high(ready[0].n, items)
    else:
        by_pk = {row.n.pk: row for row in ready}

        def settle(pks: list, calls: Calls) -> None:  # rows whose calls ended while the rest are in flight
            _record(_decisions([by_pk[pk] for pk in pks], items, calls), channel, tier, calls.marked)

        done = call_standard(channel, name, items, settle)
    rest = [row for row in ready if row.n.pk not in done.settled]
    _record(_decisions(rest, items, done), channel, tier, done.marked)


def _record(decided: list[Decided], channel: str, tier: str, marked: set) -> None:
    """The record stage, then the frequency-cap slots of the rows that failed for good given back
    (docs/POLICIES.md: a row that did not reach the recipient does not count)."""
    record.record(decided, channel, tier, marked)
    caps.give_back([d.row.n for d in decided if d.decision.status == Status.FAILED])


def _targets(row: Row) -> list[tuple[str, Device | None]]:
    n = row.n
    if n.channel == "sms":
        return [(n.recipient.phone, None)]
    if n.channel == "email":
        return [(n.recipient.email, None)]
    if n.channel == "in_app":
        return [(n.recipient_id, None)]
    return [(d.push_token, d) for d in row.devices]


def _decisions(ready: list[Row], items: list[Item], done: Calls) -> list[Decided]:
    """The outcomes stage over the rows of a batch: a :class:`Decided` for every row with
    something to record."""
    now = clock.now()
    by_row: dict[uuid.UUID, list[Call]] = defaultdict(list)
    planned: dict[uuid.UUID, int] = defaultdict(int)
    for index, item in enumerate(items):
        planned[item.row.pk] += 1
        for outcome, latency_ms, ended in done.outcomes.get(index, []):
            by_row[item.row.pk].append(Call(outcome, item.device, latency_ms, ended))
    decided = []
    for row in ready:
        n = row.n
        calls = by_row.get(n.pk, [])
        if n.pk in done.no_call:
            calls = [Call(done.no_call[n.pk], None, 0, now)]
        elif not calls and n.pk in done.lost:
            continue  # lost before any call: not ours to record
        # A row lost after a call was made is recorded (attempts, sent marker, and `sent` if nobody
        # has claimed it again).
        try:
            decision = decide(n, [c.outcome for c in calls], planned=1 if n.pk in done.no_call else planned[n.pk],
                              devices=len(row.devices), waiting=done.waiting, now=now)
        except Unexpected as exc:
            log.error("send of %s raised an unexpected error; the lease will expire and it will be retried", n.pk,
                      exc_info=exc.args[0])
            continue
        if decision is None:
            continue
        attempts = [attempt_row(n, c.outcome, c.device, c.latency_ms, c.ended) for c in calls]
        errors = [(c.outcome, c.device) for c in calls if isinstance(c.outcome, Exception)]
        decided.append(Decided(row, decision, attempts, errors))
    return decided


def prepare(n: Notification, already_sent: set[str], content: Content, stopped_phones: set[str] | None = None,
            devices: list[Device] | None = None, limits: SendLimits | None = None) -> Row | None:
    """The stages before the provider call for the claimed row ``n``: sent marker, provider lookup
    of a call in doubt, checks verdict, content, push devices.

    Returns ``None`` when the row was settled here (sent marker found or found at the provider,
    cancelled, expired, suppressed, deferred for quiet hours, template error, no active device);
    otherwise the :class:`Row` to call for: its active push devices (``[]`` for the other
    channels), whether it goes silently, its send options. ``stopped_phones`` / ``devices`` /
    ``limits`` (the abuse limits' rules) are per batch; ``None`` = look them up.
    """
    now = clock.now()
    if str(n.pk) in already_sent:
        _apply(n, checks.MARKER_FOUND, now)
        return None
    if n.reason in RESEND_AFTER_UNKNOWN and load.found_at_provider(n, content):
        return None
    if devices is None and n.channel == "push":
        devices = load.devices([n]).get(n.recipient_id, [])
    facts = Facts(campaign_cancelled=bool(n.campaign_id) and content.cancelled(n), stopped_phones=stopped_phones,
                  devices=devices or [], kind=content.types.type_of(n))
    verdict = checks.verdict(n, facts, now)
    silent = False
    if verdict is not None and verdict.kind == checks.SILENT:
        silent = True  # load.message_for makes it a data-only push
        record.note(n, verdict.kind, verdict.detail)
    elif verdict is not None:
        _apply(n, verdict, now)
        return None
    verdict = checks.limit_verdict(n, limits or SendLimits(), now)
    if verdict is not None:
        _apply(n, verdict, now)
        return None
    options = None
    if content.needs_render(n):
        try:
            options = content.apply(n)
            problem = rendered_problem(n.channel, n.title, n.body, n.html, n.data)
            if problem:
                raise ContentError(problem)
        except ContentError as exc:
            # A render error may quote the event's data (a one-time code): not for a sensitive row.
            detail = (f"template error in a sensitive notification ({type(exc.__cause__ or exc).__name__}; the text "
                      "is hidden: preview the type in the admin)") if n.sensitive else str(exc)
            record.finish(n, Status.FAILED, Reason.TEMPLATE_ERROR, kind="dead_lettered", detail=detail[:500],
                          extra={"dead_lettered_at": now})
            return None
    verdict = checks.device_verdict(n, facts)
    if verdict is not None:
        _apply(n, verdict, now)
        return None
    return Row(n, facts.devices if n.channel == "push" else [], silent, options)


def _apply(n: Notification, verdict: checks.Verdict, now) -> None:
    """Record a verdict of the checks stage on ``n``."""
    if verdict is checks.MARKER_FOUND:
        record.finish(n, Status.SENT, kind="sent", detail=verdict.detail, extra={"sent_at": now}, attempts=[
            AttemptRow(n.pk, n.attempts, (n.provider or "-")[:32], None, Outcome.DUPLICATE_SKIPPED.value, "", "",
                       None, None, "", now)])
    elif verdict.until is not None:
        # A deferral is not a delivery attempt: give back the attempt the claim counted.
        record.defer(n, verdict.until, verdict.reason, kind=verdict.kind, detail=verdict.detail,
                     extra={"attempts": n.attempts - 1})
    else:
        record.finish(n, verdict.status, verdict.reason, kind=verdict.kind, detail=verdict.detail)

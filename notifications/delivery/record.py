"""Record stage of the delivery pipeline (docs/ARCHITECTURE.md, "The send path"): verdicts and
decisions written, in bulk for 1 or N rows where many rows share them (sent, waits, retries), then
sent markers and metrics.

Every state change is a conditional UPDATE on the claimed row (``status = 'sending'`` and our
claim number, ``claims``): a row that changed hands is never overwritten. ``sent`` is also recorded on a row
the reconciler took back after its lease ran out (``lease_expired``) as long as nobody has claimed
it again: the call we made was accepted, so the pending re-send must not happen.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from core.postgres import array_literal, copy_rows
from core.redaction import without_sensitive
from notifications import lifecycle, metrics
from notifications import sent_markers as markers
from notifications.delivery.outcomes import (
    ATTEMPT_COLUMNS,
    AttemptRow,
    CallError,
    Decision,
    backoff_seconds,
    error_detail,
    outcome_unknown,
    retry_delay,
    shown,
)
from notifications.delivery.routing import sms_sender
from notifications.delivery.types import Decided
from notifications.enqueue import enqueue_on_commit
from notifications.events import fallback
from notifications.events.content import SendOptions
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status, log_of
from preferences.models import Device, SmsStop
from providers.base import ContactInvalidError, TransientProviderError

log = logging.getLogger(__name__)
Outcome = DeliveryAttempt.Outcome
ATTEMPTS_TABLE = DeliveryAttempt._meta.db_table

# An event's rows keep what they said (rendered at send time from their type): support reads it.
_CONTENT_SQL = """
UPDATE notifications_notification AS n
   SET title = v.title, body = v.body, html = v.html, data = NULLIF(v.data, '')::jsonb,
       sensitive = n.sensitive OR v.sensitive
  FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bool[])
       AS v(id, title, body, html, data, sensitive)
 WHERE n.id = v.id
"""


# --- one row ----------------------------------------------------------------------------------

def transition(n: Notification, status: str, reason: str = "", *, kind: str, detail: str = "",
               attempts: Sequence[AttemptRow] = (), extra: dict | None = None) -> bool:
    """Move a claimed (``sending``) row to ``status``, with its attempt rows and timeline event.
    Returns False if the row was no longer ours (another worker re-claimed it, or it was settled)."""
    detail = shown(n, detail)
    fields = {"reason": reason, "reason_detail": detail[:500], "lease_until": None, "updated_at": clock.now(),
              **(extra or {})}
    if status == Status.SENT:
        fields.setdefault("due_at", None)
    moved = lifecycle.record_one(n, status, fields, kind=kind)
    copy_rows(ATTEMPTS_TABLE, ATTEMPT_COLUMNS, list(attempts))
    if moved:
        if from_event(n):  # an event's or digest's row: the next channel of a fallback type is decided with it
            fallback.settle([(n.pk, status, reason, n.channel)])
        metrics.notification_transitioned(n)
    else:
        log.warning("notification %s changed hands before it could be recorded as %s", n.pk, status)
    return bool(moved)


def note(n: Notification, kind: str, detail: str) -> None:
    """A timeline event on a claimed row that does not change its state (``silent``: it is sent now
    as a silent push)."""
    DeliveryEvent.objects.create(notification=n, kind=kind, status=Status.SENDING, detail=shown(n, detail)[:500])


def from_event(n: Notification) -> bool:
    """Whether ``n`` was made by an event or a digest of events: its content is rendered at send time
    (kept when it is sent) and, for a fallback type, the channel after it waits for its end."""
    return bool(n.event_id or n.digest_id)


def finish(n: Notification, status: str, reason: str = "", **kw) -> bool:
    """:func:`transition` in its own transaction."""
    with transaction.atomic():
        return transition(n, status, reason, **kw)


def defer(n: Notification, until: datetime, reason: str, **kw) -> bool:
    """Back to ``scheduled`` (the row waits in Postgres) until ``until`` (UTC); the scheduler releases it."""
    extra = kw.pop("extra", {})
    extra["due_at"] = until
    with transaction.atomic():
        return transition(n, Status.SCHEDULED, reason, extra=extra, **kw)


def worker_error(n: Notification, exc: Exception) -> None:
    """The stages before the call crashed on ``n`` (a bug, bad stored data): nothing was sent.
    Retried with backoff like a transient error, then dead-lettered with the error once the attempt
    budget is spent (the poison-message rule), so one bad row never loops or blocks a batch."""
    log.error("checks of %s %s %s crashed (attempt %d): %s", n.priority, n.channel, n.pk, n.attempts, exc,
              exc_info=exc)
    detail = without_sensitive(f"{type(exc).__name__}: {exc}")[:400]
    now = clock.now()
    try:
        if n.attempts >= settings.NOTIFY["MAX_ATTEMPTS"][n.priority]:
            finish(n, Status.FAILED, Reason.WORKER_ERROR, kind="dead_lettered",
                   detail=f"{n.attempts} attempts crashed the worker; last: {detail}", extra={"dead_lettered_at": now})
            return
        delay = backoff_seconds(n.attempts, n.priority)
        defer(n, now + timedelta(seconds=delay), Reason.WORKER_ERROR, kind="retry",
              detail=f"attempt {n.attempts} crashed the worker ({detail}); retry in {delay:.1f}s")
    except Exception:
        log.exception("recording the crash of %s failed too; its lease will expire and it will be retried", n.pk)


# --- decisions of a batch -----------------------------------------------------------------------

def record(decided: list[Decided], channel: str, tier: str, marked: set | frozenset = frozenset()) -> None:
    """Apply the decisions of one channel's batch. Sent rows and waits in bulk; retries sharing an
    error in one backoff; the rest (dead letters, contact invalid) one by one. ``marked``: row ids
    whose sent marker the calls stage already wrote (not written again). Never raises: a row whose
    recording crashes keeps its lease and is retried when it runs out."""
    sent: dict[str, list[Decided]] = defaultdict(list)
    waits: dict[tuple, list[Notification]] = defaultdict(list)
    retries: dict[tuple, list[Decided]] = defaultdict(list)
    single: list[Decided] = []
    for d in decided:
        decision = d.decision
        try:
            deactivate_dead_contacts(d.row.n, d.errors, d.row.options)
        except Exception:
            log.exception("contact hygiene of %s failed", d.row.n.pk)
        if decision.action == "sent":
            sent[decision.accepted[0].provider[:32]].append(d)
        elif decision.action == "wait":
            waits[(decision.until, decision.detail)].append(d.row.n)
        elif decision.action == "retry":
            exc = _provider_error(decision)
            retries[(exc.provider, exc.code, outcome_unknown(exc))].append(d)
        else:
            single.append(d)
    for provider, rows in sent.items():
        _guarded(record_sent, rows, provider, channel, tier, marked)
    for (until, detail), waiting in waits.items():
        _guarded(reschedule, waiting, until, detail, kind="deferred", give_back_attempt=True)
    for failed in retries.values():
        _guarded(record_retry, failed)
    for d in single:
        n, decision = d.row.n, d.decision
        metrics.provider_calls(n, d.attempts)
        _guarded(finish, n, decision.status, decision.reason, kind=decision.kind, detail=decision.detail,
                 attempts=d.attempts, extra={"provider": _provider_error(decision).provider,
                                           **({"dead_lettered_at": clock.now()}
                                              if decision.action == "dead_letter" else {})})


def _guarded(function, *args, **kwargs) -> None:
    try:
        function(*args, **kwargs)
    except Exception:
        log.exception("recording a batch outcome (%s) crashed; the leases will expire and the rows will be retried",
                      function.__name__)


def _provider_error(decision: Decision) -> CallError:
    """The error a retry, dead letter or failure is about (:func:`outcomes.decide` sets one)."""
    assert decision.error is not None, decision
    return decision.error


def record_sent(rows: list[Decided], provider: str, channel: str, tier: str,
                marked: set | frozenset = frozenset()) -> None:
    """The calls of these rows were accepted by ``provider``: ``sending → sent`` in one UPDATE, the
    attempt rows by COPY, then the sent markers of the rows not in ``marked`` in one script call."""
    now = clock.now()
    ns = [d.row.n for d in rows]
    ids = [str(n.pk) for n in ns]
    numbers = [n.attempts for n in ns]
    message_ids = [d.decision.accepted[0].provider_message_id[:255] for d in rows]
    details = [d.decision.detail for d in rows]
    attempts = [a for d in rows for a in d.attempts]
    with transaction.atomic():
        moved = lifecycle.sent(now, provider, ids, [n.claims for n in ns], message_ids, details)
        copy_rows(ATTEMPTS_TABLE, ATTEMPT_COLUMNS, attempts)
        typed = [n for n in ns if from_event(n) and str(n.pk) in moved]
        if typed:
            cur_args = [array_literal(str(n.pk) for n in typed), array_literal(n.title or "" for n in typed),
                        array_literal(n.body or "" for n in typed), array_literal(n.html or "" for n in typed),
                        array_literal(json.dumps(n.data) if n.data else "" for n in typed),
                        array_literal("t" if n.sensitive else "f" for n in typed)]
            with connection.cursor() as cur:
                cur.execute(_CONTENT_SQL, cur_args)
        # Events' rows of a fallback type: the channels waiting behind them are not needed.
        fallback.settle([(n.pk, Status.SENT, "", n.channel) for n in ns if from_event(n) and str(n.pk) in moved])
        for index, i in enumerate(ids):
            if i not in moved:
                # The receipt settled the row before we recorded the call (or it changed hands):
                # keep what only we know; our attempt rows replace the receipt's stand-in.
                Notification.objects.filter(pk=i, provider_message_id="").update(
                    provider=provider, provider_message_id=message_ids[index], sent_at=now)
                log_of(DeliveryAttempt, [ns[index]]).filter(number=numbers[index],
                                                            outcome=Outcome.LEARNED_FROM_RECEIPT).delete()
    # After the rows say `sent` (committed above). Also for rows recorded elsewhere meanwhile:
    # the provider accepted them, so no later attempt may send them again.
    markers.mark_sent([str(n.pk) for n in ns if n.pk not in marked])
    accepted = [a for a in attempts if a.outcome == Outcome.ACCEPTED]
    for d in rows:
        metrics.provider_calls(d.row.n, [a for a in d.attempts if a.outcome != Outcome.ACCEPTED])
    starts = (metrics.accept_started_at(n) for n in ns if str(n.pk) in moved)
    latencies = [(now - start).total_seconds() for start in starts if start is not None]
    metrics.batch_recorded(channel=channel, tier=tier, provider=provider, sent=len(moved), calls=len(accepted),
                           call_seconds=sum(a.latency_ms or 0 for a in accepted) / 1000, accept_latencies=latencies)
    log.info("sent %d %s %s notification(s) via %s", len(moved), tier, channel, provider)


def record_retry(rows: list[Decided]) -> None:
    """These rows failed with the same transient error: one backoff for the group (from the row with
    the most attempts, honouring Retry-After). A high-tier row (a batch of one) due within
    ``MAX_COUNTDOWN_SECONDS`` goes back to its queue with a countdown; otherwise the rows wait in
    ``scheduled`` together, so the scheduler releases standard rows as batches again instead of one
    retry task per row."""
    exc = rows[0].decision.error
    assert isinstance(exc, TransientProviderError), exc  # outcomes.decide retries only transient errors
    now = clock.now()
    ns = [d.row.n for d in rows]
    slowest = max(ns, key=lambda n: n.attempts)
    for d in rows:
        metrics.provider_calls(d.row.n, d.attempts)
    delay, reason = retry_delay(slowest, exc)
    detail = f"attempt {slowest.attempts} failed ({error_detail(exc)}); retry in {delay:.1f}s"
    if reason == Reason.OUTCOME_UNKNOWN:
        detail += " (it may have been accepted: looked up or waited for first)"
    attempts = [a for d in rows for a in d.attempts]
    if len(rows) == 1 and slowest.priority == "high" and delay <= settings.NOTIFY["MAX_COUNTDOWN_SECONDS"]:
        n = ns[0]
        with transaction.atomic():
            if transition(n, Status.QUEUED, reason, kind="retry", detail=detail, attempts=attempts,
                          extra={"queued_at": now + timedelta(seconds=delay)}):
                enqueue_on_commit([(n.pk, n.priority, n.channel)], countdown=delay)
        return
    reschedule(ns, now + timedelta(seconds=delay), shown(ns, detail),
               kind="retry", give_back_attempt=False, attempts=attempts, reason=reason)


def suppress(rows: list[tuple[Notification, str]], reason: str) -> list[Notification]:
    """``sending → suppressed`` with ``reason`` for ``(row, detail)`` pairs in one UPDATE, their
    timeline events by COPY, and the fallback channels behind the event rows decided, in one
    transaction. Returns the rows that moved (a row that changed hands is left alone)."""
    now = clock.now()
    details = {n.pk: shown(n, detail)[:500] for n, detail in rows}
    with transaction.atomic():
        done = lifecycle.suppress([n for n, _d in rows], details, reason, now)
        fallback.settle([(n.pk, Status.SUPPRESSED, reason, n.channel) for n in done if from_event(n)])
    for n in done:
        metrics.notification_transitioned(n)
    return done


def reschedule(rows: list[Notification], until: datetime, detail: str, *, kind: str, give_back_attempt: bool,
               attempts: Sequence[AttemptRow] = (), reason: str = Reason.RETRY_SCHEDULED) -> None:
    """Back to ``scheduled`` until ``until`` (UTC) in one UPDATE (the attempt given back for a wait
    that made no call), attempt rows and events by COPY."""
    now = clock.now()
    with transaction.atomic():
        moved = lifecycle.reschedule(rows, until, reason, detail[:500], kind, now,
                                     give_back_attempt=give_back_attempt)
        copy_rows(ATTEMPTS_TABLE, ATTEMPT_COLUMNS, list(attempts))
    for n in rows:
        if str(n.pk) in moved:
            metrics.notification_transitioned(n)


def deactivate_dead_contacts(n: Notification, errors: list[tuple[CallError, Device | None]],
                             options: SendOptions | None = None) -> None:
    """Contact hygiene for the ``(error, device)`` pairs of ``n``'s calls: a dead push token is
    deactivated; Twilio 21610 (the recipient replied STOP to this sender) records an SmsStop scoped
    to the sender (carrier rule: ``options``' sender, a typed row's, else the provider's); another
    invalid number or address is marked on the recipient."""
    now = clock.now()
    for exc, device in errors:
        if not isinstance(exc, ContactInvalidError):
            continue
        if device is not None:
            Device.objects.filter(pk=device.pk, active=True).update(
                active=False, deactivated_reason=exc.reason[:64], deactivated_at=now, updated_at=now)
        elif n.channel == "sms" and exc.reason == "opted_out":
            # Scoped to the sender the message went from: a type's own, else the provider's.
            sender = (options.sender if options is not None else None) or sms_sender()
            SmsStop.objects.get_or_create(phone=n.recipient.phone, sender=sender,
                                          defaults={"source": f"{exc.provider} {exc.code}"})
        elif n.channel == "sms":
            type(n.recipient).objects.filter(pk=n.recipient_id).update(
                phone_invalid_reason=exc.reason[:64], phone_invalid_at=now)
        elif n.channel == "email":
            type(n.recipient).objects.filter(pk=n.recipient_id).update(
                email_invalid_reason=exc.reason[:64], email_invalid_at=now)

"""The standard tier's batch path: one task's claimed rows sent and recorded in bulk.

Per batch (a send task carries up to ``NOTIFY["BATCH_SIZE"][channel]`` ids; the claim, the row and
recipient query and the sent-marker MGET are done once by :func:`notifications.sending.send_notifications`):

1. checks per row (:func:`notifications.sending.prepare`), with the SMS STOP list and the push
   devices of the whole batch loaded in one query each;
2. the primary provider only: standard traffic waits for it rather than failing over. While its
   circuit breaker is open the rows go back to ``scheduled`` until the next probe is due, without
   spending an attempt;
3. tokens for the batch from the provider's standard budget (never the high tier's reserve), as
   many as the bucket grants at once, waiting for the rest;
4. concurrent-call slots from the provider's bulkhead, then one ``send_batch`` call per grant:
   SendGrid sends up to 1,000 recipients per request; Twilio and FCM one SDK call per message,
   several in flight (``NOTIFY["SEND_CONCURRENCY"]``);
5. the accepted rows recorded in one transaction (one UPDATE … FROM unnest, attempt and event rows
   in bulk), then their sent markers in one pipeline. Anything else (provider errors, partial push
   results) goes through the single-row recording of :mod:`notifications.recording`, so retries,
   dead letters and contact hygiene behave exactly as for single sends.

Leases: the process's lease keeper renews the lease of every row of the batch for as long as the
task runs (notifications/leases.py), and before each ``send_batch`` call the rows it carries get a
lease that covers the call's deadline; a row that changed hands meanwhile is dropped, never sent.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from core.postgres import array_literal, copy_rows
from notifications import leases, metrics
from notifications import sent_markers as markers
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status
from notifications.recording import Call, attempt_for, error_detail, record_call, retry_delay, shown
from notifications.routing import sms_sender
from notifications.sending import _CampaignContent, call_deadline_seconds, message_for, prepare, worker_error
from preferences.models import Device, SmsStop
from providers import isolation
from providers.base import ProviderConfigurationError, ProviderError, TransientProviderError
from providers.registry import get_backend, provider_names, unavailable_channel_problem

log = logging.getLogger(__name__)
Outcome = DeliveryAttempt.Outcome

# Arrays travel as one text literal each (array_literal): Django's client-side binding would
# otherwise quote every element in Python (~60 µs per row measured on a 500-row batch).
_SENT_SQL = """
UPDATE notifications_notification AS n
   SET status = 'sent', reason = '', reason_detail = v.detail, lease_until = NULL, due_at = NULL, updated_at = %s,
       sent_at = %s, provider = %s, provider_message_id = v.pmid
  FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::text[]) AS v(id, attempts, pmid, detail)
 WHERE n.id = v.id AND n.attempts = v.attempts
   AND (n.status = 'sending' OR (n.status IN ('scheduled', 'queued') AND n.reason = 'lease_expired'))
RETURNING n.id
"""

_ATTEMPT_COLUMNS = ("notification_id", "number", "provider", "device_id", "outcome", "error_code", "error_message",
                    "http_status", "latency_ms", "provider_message_id", "created_at")
_EVENT_COLUMNS = ("notification_id", "kind", "status", "reason", "detail", "created_at")


_WAIT_SQL = """
UPDATE notifications_notification AS n
   SET status = 'scheduled', reason = %s, reason_detail = %s, lease_until = NULL, updated_at = %s,
       due_at = %s, attempts = n.attempts - %s
  FROM unnest(%s::uuid[], %s::int[]) AS v(id, attempts)
 WHERE n.id = v.id AND n.status = 'sending' AND n.attempts = v.attempts
RETURNING n.id
"""

#: SendGrid v3 mail/send: recipients per request (one send_batch call is one request).
MAX_PER_REQUEST = 1000


def _attempts_spent(n: Notification) -> bool:
    """Would a transient failure now dead-letter ``n`` (the single-row rule in recording.py)?"""
    window = timedelta(seconds=settings.NOTIFY["MIN_RETRY_WINDOW_SECONDS"][n.priority])
    return (n.attempts >= settings.NOTIFY["MAX_ATTEMPTS"][n.priority]
            and clock.now() - (n.first_attempt_at or clock.now()) >= window)


def deliver_batch(rows: list[Notification], already_sent: set[str], content: _CampaignContent) -> None:
    """Deliver claimed standard-tier rows (``sending``, with recipient and preferences loaded)."""
    by_channel: dict[str, list[Notification]] = defaultdict(list)
    for n in rows:
        by_channel[n.channel].append(n)
    for channel, group in by_channel.items():
        _Batch(channel, group).deliver(already_sent, content)


class _Batch:
    """One channel's rows of one task, from checks to records."""

    def __init__(self, channel: str, rows: list[Notification]) -> None:
        self.channel = channel
        self.rows = rows
        # None: the channel has no provider (an empty *_PROVIDERS list); its rows become dead letters.
        self.provider = None if unavailable_channel_problem(channel) else provider_names(channel)[0]
        # (notification, device or None, OutboundMessage) per provider call to make
        self.items: list[tuple] = []
        # item index -> (SendResult or exception, latency ms)
        self.results: dict[int, tuple] = {}
        # rows whose lease lapsed and that another worker claimed: not ours to record
        self.lost_rows: set = set()

    def deliver(self, already_sent: set[str], content: _CampaignContent) -> None:
        stopped = self._stopped_phones() if self.channel == "sms" else None
        devices = self._devices() if self.channel == "push" else None
        ready = []
        for n in self.rows:
            try:
                found = prepare(n, already_sent, content, stopped,
                                devices.get(n.recipient_id, []) if devices is not None else None)
            except Exception as exc:
                worker_error(n, exc)
                continue
            if found is not None:
                ready.append((n, found))
        if not ready:
            return
        if self.provider is None:
            self._no_provider(ready)
            return
        for n, found in ready:
            if self.channel == "sms":
                self.items.append((n, None, message_for(n, n.recipient.phone)))
            elif self.channel == "email":
                self.items.append((n, None, message_for(n, n.recipient.email)))
            else:
                self.items.extend((n, d, message_for(n, d.push_token, d.platform)) for d in found)
        waiting = self._send()
        # A row lost before any call is not ours to record; one lost after a call was made is
        # recorded (attempts, sent marker, and `sent` if nobody has claimed it again).
        called = {self.items[i][0].pk for i in self.results}
        self._record([(n, d) for n, d in ready if n.pk not in self.lost_rows or n.pk in called], waiting)

    def _no_provider(self, ready: list) -> None:
        """The channel has no provider: each row that passed its checks fails as a dead letter with
        the reason (``configuration_error``, "no push provider is configured …"), recorded as the
        single path records it, rather than crashing the batch into retries."""
        error = ProviderConfigurationError(self.channel, unavailable_channel_problem(self.channel),
                                           code="not_configured")
        for n, found in ready:
            call = Call()
            call.errors.append((error, None))
            record_call(n, call, [attempt_for(n, error, latency_ms=0)], found if self.channel == "push" else [])

    # --- preloading ---------------------------------------------------------------------------

    def _stopped_phones(self) -> set[str]:
        phones = {n.recipient.phone for n in self.rows if n.recipient.phone}
        if not phones:
            return set()
        return set(SmsStop.objects.filter(sender=sms_sender(), phone__in=phones).values_list("phone", flat=True))

    def _devices(self) -> dict[int, list[Device]]:
        found: dict[int, list[Device]] = defaultdict(list)
        recipients = {n.recipient_id for n in self.rows}
        for device in Device.objects.filter(recipient_id__in=recipients, active=True).order_by("recipient_id", "id"):
            found[device.recipient_id].append(device)
        return found

    # --- sending ------------------------------------------------------------------------------

    def _send(self):
        """Send every item the budget, breaker and bulkhead allow. Returns ``None``, or
        ``(until, detail)``: the rest must wait until ``until`` (UTC) because the provider's breaker
        is open, or because budget or bulkhead slots did not come within ``BATCH_MAX_WAIT_SECONDS``.

        Each ``send_batch`` call is bounded by one provider timeout (one message per thread, or one
        SendGrid request), and the rows it carries get a lease covering that before it starts (the
        heartbeat renews them meanwhile too), so no call outlives the lease of a row it sends.
        """
        name = self.provider
        backend = get_backend(self.channel, name)
        batch_api = getattr(backend, "batch_api", False)
        concurrency = max(1, int(settings.NOTIFY["SEND_CONCURRENCY"][self.channel]))
        call_lease = call_deadline_seconds()
        deadline = time.monotonic() + float(settings.NOTIFY["BATCH_MAX_WAIT_SECONDS"])
        pending = list(range(len(self.items)))
        budget_waited = 0.0
        while pending:
            verdict = isolation.breaker_allows(name)
            if not verdict.allowed:
                metrics.isolation_event("breaker_fast_fail", name, "standard")
                until = clock.now() + timedelta(seconds=max(1.0, verdict.retry_in))
                return until, f"{name} unavailable (circuit breaker open); waiting until {until.isoformat()}"
            if time.monotonic() > deadline:
                until = clock.now() + timedelta(seconds=5)
                return until, (f"no {name} budget or call slot for {settings.NOTIFY['BATCH_MAX_WAIT_SECONDS']} s; "
                               f"waiting until {until.isoformat()}")
            slots = isolation.acquire_slots(name, "standard", 1 if batch_api else concurrency, call_lease)
            if not slots:
                metrics.isolation_event("bulkhead_full", name, "standard")
                time.sleep(0.05)
                continue
            if verdict.probe:
                want = 1
            elif batch_api:
                want = min(len(pending), MAX_PER_REQUEST)
            else:
                want = min(len(pending), len(slots))
            granted, wait = isolation.take_tokens(name, "standard", want)
            if not granted:
                isolation.release_slots(name, "standard", slots)
                pause = min(max(wait, 0.01), 1.0, max(0.0, deadline - time.monotonic()) + 0.01)
                time.sleep(pause)
                budget_waited += pause
                continue
            chunk, pending = pending[:granted], pending[granted:]
            # Budget and slots can take a while on a loaded machine: the chunk's leases must cover
            # the call from here (no call outlives its row's lease).
            owned = set(self._still_ours(chunk, call_lease))
            if len(owned) < len(chunk):
                chunk = [i for i in chunk if i in owned]
                if not chunk:
                    isolation.release_slots(name, "standard", slots)
                    continue
            started = time.monotonic()
            try:
                outcomes = backend.send_batch([self.items[i][2] for i in chunk],
                                              concurrency=min(len(slots), len(chunk)))
            finally:
                isolation.release_slots(name, "standard", slots)
            latency_ms = int((time.monotonic() - started) * 1000)
            failed = 0
            for index, outcome in zip(chunk, outcomes, strict=True):
                self.results[index] = (outcome, latency_ms)
                failed += isinstance(outcome, Exception) and isolation.is_failure(outcome)
            if batch_api:
                # One request carried the chunk: the breaker counts requests, not recipients.
                ok_calls, failed_calls = (0, 1) if failed else (1, 0)
            else:
                ok_calls, failed_calls = len(chunk) - failed, failed
            if isolation.record_calls(name, ok=ok_calls, failed=failed_calls, probe=verdict.probe) == "open":
                metrics.isolation_event("breaker_opened", name)
        if budget_waited:
            metrics.isolation_event("budget_wait", name, "standard", seconds=budget_waited)
        return None

    def _still_ours(self, pending: list[int], seconds: float) -> list[int]:
        """``pending`` without the items of rows that are no longer ours, after making the leases of
        the rest cover ``seconds`` more (notifications/leases.py). A lost row (the reconciler took
        it over because this process stalled, or a cancel settled it) is never sent from here."""
        rows = {str(self.items[i][0].pk) for i in pending}
        owned = leases.keeper().ensure(rows, seconds)
        lost = rows - owned
        if lost:
            self.lost_rows.update(self.items[i][0].pk for i in pending if str(self.items[i][0].pk) in lost)
        return [i for i in pending if str(self.items[i][0].pk) in owned]

    # --- recording ----------------------------------------------------------------------------

    def _record(self, ready: list[tuple], waiting) -> None:
        by_row: dict = defaultdict(list)
        for index, (n, device, _message) in enumerate(self.items):
            by_row[n.pk].append((index, device))
        sent, wait, retry, single = [], [], [], []
        for n, devices in ready:
            entries = by_row.get(n.pk, [])
            done = [(self.results[i], device) for i, device in entries if i in self.results]
            if not done:
                if waiting is not None:
                    wait.append(n)
                continue
            if any(not isinstance(r, (ProviderError, ProviderConfigurationError)) and isinstance(r, Exception)
                   for (r, _ms), _d in done):
                log.error("send of %s raised an unexpected error; the lease will expire and it will be "
                          "retried", n.pk, exc_info=next(r for (r, _ms), _d in done if isinstance(r, Exception)))
                continue
            if len(done) == len(entries) and all(not isinstance(r, Exception) for (r, _ms), _d in done):
                sent.append((n, done))
            elif (len(done) == len(entries) and all(isinstance(r, TransientProviderError) for (r, _ms), _d in done)
                  and not _attempts_spent(n)):
                retry.append((n, done))
            else:
                single.append((n, devices, done, len(entries) - len(done)))
        if sent:
            self._record_sent(sent)
        if wait:
            self._record_waiting(wait, *waiting)
        if retry:
            self._record_retry(retry)
        for n, devices, done, skipped in single:
            try:
                self._record_single(n, devices, done, skipped)
            except Exception:
                log.exception("recording %s crashed; the lease will expire and it will be retried", n.pk)

    def _record_sent(self, sent: list[tuple]) -> None:
        """Every call of these rows was accepted: ``sending → sent`` in bulk, then the markers."""
        now = clock.now()
        ids, attempt_numbers, message_ids, details, attempts = [], [], [], [], []
        for n, done in sent:
            ids.append(str(n.pk))
            attempt_numbers.append(n.attempts)
            message_ids.append(done[0][0][0].provider_message_id[:255])
            details.append(f"accepted for {len(done)} of {len(done)} device(s)" if self.channel == "push" else "")
            for (result, latency_ms), device in done:
                attempts.append((n.pk, n.attempts, result.provider[:32], device.pk if device else None,
                                 Outcome.ACCEPTED.value, "", "", None, latency_ms,
                                 result.provider_message_id[:255], now))
        provider = sent[0][1][0][0][0].provider[:32]
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(_SENT_SQL, [now, now, provider, array_literal(ids), array_literal(attempt_numbers),
                                        array_literal(message_ids), array_literal(details)])
                moved = {str(row[0]) for row in cur.fetchall()}
            copy_rows(DeliveryAttempt._meta.db_table, _ATTEMPT_COLUMNS, attempts)
            copy_rows(DeliveryEvent._meta.db_table, _EVENT_COLUMNS,
                      [(i, "sent", Status.SENT.value, "", d, now) for i, d in zip(ids, details, strict=True)
                       if i in moved])
            for index, i in enumerate(ids):
                if i not in moved:
                    # The receipt settled the row before we recorded the call (or it changed hands):
                    # keep what only we know; our attempt rows replace the receipt's stand-in.
                    Notification.objects.filter(pk=i, provider_message_id="").update(
                        provider=provider, provider_message_id=message_ids[index], sent_at=now)
                    DeliveryAttempt.objects.filter(notification_id=i, number=attempt_numbers[index],
                                                   outcome=Outcome.LEARNED_FROM_RECEIPT).delete()
        # After the rows say `sent` (committed above). Also for rows recorded elsewhere meanwhile:
        # the provider accepted them, so no later attempt may send them again.
        markers.mark_sent(ids)
        starts = (metrics.accept_started_at(n) for n, _done in sent if str(n.pk) in moved)
        latencies = [(now - start).total_seconds() for start in starts if start is not None]
        metrics.batch_recorded(channel=self.channel, tier="standard", provider=provider, sent=len(moved),
                               calls=len(attempts), call_seconds=sum(a[8] or 0 for a in attempts) / 1000,
                               accept_latencies=latencies)
        log.info("sent %d standard %s notification(s) via %s in one batch", len(moved), self.channel, provider)

    def _record_waiting(self, rows: list[Notification], until, detail: str) -> None:
        """Not sent (breaker open, or no budget/slot in time): back to ``scheduled`` until ``until``,
        the attempt given back."""
        self._reschedule(rows, until, detail, kind="deferred", give_back_attempt=True)

    def _record_retry(self, retry: list[tuple]) -> None:
        """Every call of these rows failed transiently (a refused SendGrid request: all its
        recipients): one backoff for the group, back to ``scheduled`` together, so the scheduler
        releases them as batches again instead of one retry task per row."""
        exc = retry[0][1][0][0][0]
        now = clock.now()
        slowest = max((n for n, _ in retry), key=lambda n: n.attempts)
        attempts = []
        for n, done in retry:
            for (error, latency_ms), device in done:
                a = attempt_for(n, error, device=device, latency_ms=latency_ms)
                attempts.append((n.pk, a.number, a.provider, a.device_id, a.outcome, a.error_code, a.error_message,
                                 a.http_status, a.latency_ms, a.provider_message_id, now))
                metrics.provider_call(n, a)
        delay, reason = retry_delay(slowest, exc)
        until = clock.now() + timedelta(seconds=delay)
        detail = f"attempt failed ({error_detail(exc)}); retry in {delay:.1f}s"
        if reason == Reason.OUTCOME_UNKNOWN:
            detail += " (it may have been accepted: waited for first)"
        detail = shown([n for n, _ in retry], detail)
        self._reschedule([n for n, _ in retry], until, detail, kind="retry", give_back_attempt=False,
                         attempts=attempts, reason=reason)

    def _reschedule(self, rows: list[Notification], until, detail: str, *, kind: str, give_back_attempt: bool,
                    attempts: list[tuple] = (), reason: str = Reason.RETRY_SCHEDULED) -> None:
        now = clock.now()
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute(_WAIT_SQL, [reason, detail[:500], now, until, 1 if give_back_attempt else 0,
                                        array_literal(n.pk for n in rows), array_literal(n.attempts for n in rows)])
                moved = {str(row[0]) for row in cur.fetchall()}
            copy_rows(DeliveryAttempt._meta.db_table, _ATTEMPT_COLUMNS, list(attempts))
            copy_rows(DeliveryEvent._meta.db_table, _EVENT_COLUMNS,
                      [(n.pk, kind, Status.SCHEDULED.value, str(reason), detail[:500], now)
                       for n in rows if str(n.pk) in moved])
        for n in rows:
            if str(n.pk) in moved:
                n.status, n.reason = Status.SCHEDULED, reason
                metrics.notification_transitioned(n)

    def _record_single(self, n: Notification, devices: list, done: list, skipped: int) -> None:
        """Errors, or a push partly sent: the single-row recording (retries, dead letters, hygiene)."""
        call = Call()
        attempts = []
        for (outcome, latency_ms), device in done:
            if isinstance(outcome, Exception):
                call.errors.append((outcome, device))
            else:
                call.accepted.append(outcome)
            attempt = attempt_for(n, outcome, device=device, latency_ms=latency_ms)
            attempts.append(attempt)
            metrics.provider_call(n, attempt)
        if skipped and not call.accepted:
            call.errors.append((TransientProviderError(self.provider, "circuit_open",
                                                       "circuit breaker opened during the batch"), None))
        record_call(n, call, attempts, devices)

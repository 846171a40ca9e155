"""Delivering the outbox (docs/WEBHOOKS.md, "Delivery"): the webhook worker, never the send path.

Every ``WEBHOOKS_DISPATCH_SECONDS`` the dispatcher (:func:`dispatch`) publishes one task per
endpoint with due deliveries; :func:`deliver_endpoint` takes the endpoint's lease (``busy_until``
and its holder's token ``lease``: one batch in flight per endpoint), reads up to ``BATCH_SIZE`` due
deliveries and posts them in order, signed per the Standard Webhooks spec with its reference
library, until the batch's time budget is spent; each request ends by its timeout. A slow endpoint
so holds one worker thread for at most its budget plus one timeout and never delays another
client's webhooks.

Outcomes: a 2xx delivers; a timeout, a connection error, a 429 or a 5xx is tried again after
``Retry-After`` when it gives a future time (at least the base delay), else an exponential
backoff, until ``RETRY_FOR_SECONDS`` after the first attempt; any other answer (a 3xx: redirects
are not followed, a 4xx) fails the delivery at once. Each attempt is a :class:`WebhookAttempt`
row. An endpoint with no success for ``DISABLE_AFTER_SECONDS`` is disabled with its reason.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from standardwebhooks import Webhook

from core import clock
from core.postgres import array_literal, copy_rows
from core.queues import WEBHOOK_DELIVER_TASK, WEBHOOKS_QUEUE
from notifications.webhooks import transport
from notifications.webhooks.models import TEST_EVENT, WebhookAttempt, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)
State = WebhookDelivery.State


def _conf(key: str) -> float:
    return settings.WEBHOOKS[key]


#: A run not started by then is dropped: the dispatcher queues another while deliveries are due (a
#: backlog of the webhook queue never grows past a few runs per endpoint).
PUBLISHED_EXPIRE_SECONDS = 30


def publish(endpoint_id) -> None:
    """Queue one delivery run for the endpoint (by task name: this module does not import the tasks)."""
    current_app.send_task(WEBHOOK_DELIVER_TASK, args=[str(endpoint_id)], queue=WEBHOOKS_QUEUE,
                          routing_key=WEBHOOKS_QUEUE, exchange="", expires=PUBLISHED_EXPIRE_SECONDS)


def dispatch(now: datetime | None = None) -> int:
    """Publish a delivery run for every active, idle endpoint with a due delivery; returns how many."""
    now = now or clock.now()
    due = WebhookDelivery.objects.filter(endpoint=OuterRef("pk"), state=State.PENDING, next_attempt_at__lte=now)
    idle = Q(busy_until__isnull=True) | Q(busy_until__lt=now)
    endpoints = list(WebhookEndpoint.objects.filter(idle, Exists(due), active=True).values_list("pk", flat=True)[:1000])
    for pk in endpoints:
        publish(pk)
    return len(endpoints)


def retry_delay(attempt: int, retry_after: str, now: datetime) -> float:
    """Seconds until the next try: the endpoint's ``Retry-After`` (seconds or an HTTP date) when it
    gives a positive one, at least ``RETRY_BASE_SECONDS``; else (none, invalid, zero, negative, a
    past date) ``RETRY_BASE_SECONDS * 2**(attempt-1)``. Capped at ``RETRY_CAP_SECONDS``. ``now``: the
    host's real time, which a date is counted from (:func:`attempt`)."""
    cap, base = _conf("RETRY_CAP_SECONDS"), _conf("RETRY_BASE_SECONDS")
    asked = _retry_after_seconds(retry_after.strip(), now)
    if asked is not None and asked > 0:
        return min(cap, max(base, asked))
    return min(cap, base * 2 ** (attempt - 1))


def _retry_after_seconds(value: str, now: datetime) -> float | None:
    """``Retry-After`` in seconds from ``now`` (None: absent or not a finite number nor an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - now).total_seconds()
        except (TypeError, ValueError):
            return None
    return seconds if math.isfinite(seconds) else None


def body_of(delivery: WebhookDelivery) -> bytes:
    return json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False).encode()


def wall_clock() -> datetime:
    """This host's real time (``time.time()``), never the platform clock: for the facts on the wire
    between two real hosts, which the other side judges by its own clock (:func:`attempt`)."""
    return datetime.fromtimestamp(time.time(), UTC)


def signed_headers(signer: Webhook, delivery: WebhookDelivery, body: bytes, at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers, signed by the spec's reference library (``Webhook(secret)``);
    ``at``: the host's real time (:func:`wall_clock`)."""
    return {"webhook-id": delivery.message_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signer.sign(delivery.message_id, at, body)}


@dataclass
class Tried:
    """One attempt's outcome, recorded with the others of its run (:func:`record`)."""

    delivery: WebhookDelivery
    number: int
    status: int | None
    latency_ms: int
    error: str
    state: str
    retry_at: datetime | None
    give_up_at: datetime
    at: datetime


def attempt(delivery: WebhookDelivery, conn: transport.Connection, signer: Webhook) -> Tried:
    """One POST of ``delivery`` on ``conn`` and what follows from the answer (not recorded yet).

    Two clocks: what is recorded (attempts, retries, give-up) is on the platform clock, which tests
    move (``CLOCK_OFFSET_FILE``); the wire's instants are the host's real time: the receiver refuses a
    ``webhook-timestamp`` more than 5 minutes off its own clock (replay protection), and an HTTP-date
    ``Retry-After`` is the receiver's wall time, so its delay is counted from ours."""
    now, wall = clock.now(), wall_clock()
    body = body_of(delivery)
    answer = conn.post(body, signed_headers(signer, delivery, body, wall))
    number = delivery.attempts + 1
    give_up = delivery.give_up_at or now + timedelta(seconds=_conf("RETRY_FOR_SECONDS"))
    status = answer.status
    retry_at = None
    if status is not None and 200 <= status < 300:
        state, error = State.DELIVERED, ""
    elif status is None or status == 429 or status >= 500:
        error = answer.error or f"HTTP {status}"
        retry = now + timedelta(seconds=retry_delay(number, answer.retry_after, wall))
        state = State.PENDING if retry <= give_up else State.FAILED
        retry_at = retry if state == State.PENDING else None
        if state == State.FAILED:
            error = f"{error}; retries ran out"
    else:
        state = State.FAILED
        error = f"HTTP {status}: " + ("redirects are not followed" if 300 <= status < 400 else "refused, not retried")
    delivery.state, delivery.attempts = state, number
    return Tried(delivery, number, status, answer.latency_ms, error[:500], str(state), retry_at, give_up, now)


_ATTEMPT_COLUMNS = ("delivery_id", "number", "http_status", "latency_ms", "error", "retry_at", "created_at")
_RECORD_SQL = f"""
UPDATE {WebhookDelivery._meta.db_table} AS d
   SET state = v.state, attempts = v.number, give_up_at = v.give_up, next_attempt_at = v.next,
       last_http_status = v.status, last_error = v.error, delivered_at = v.delivered
  FROM unnest(%s::uuid[], %s::text[], %s::int[], %s::timestamptz[], %s::timestamptz[], %s::int[], %s::text[],
              %s::timestamptz[]) AS v(id, state, number, give_up, next, status, error, delivered)
 WHERE d.id = v.id
"""


def _array(values) -> str:
    """An array literal whose None items are SQL NULLs (``array_literal`` quotes every item)."""
    return "{" + ",".join("NULL" if v is None else array_literal([v])[1:-1] for v in values) + "}"


def record(endpoint: WebhookEndpoint, tried: list[Tried]) -> None:
    """A run's attempts in one transaction: one COPY of the attempt rows, one UPDATE of the
    deliveries, the endpoint's health from the last answer. A worker lost before this posts them
    again (at least once: the receiver de-duplicates by ``webhook-id``). The endpoint is locked first
    (the order a delete takes: endpoint, then deliveries); deleted meanwhile, nothing is recorded."""
    if not tried:
        return
    with transaction.atomic():
        if not list(WebhookEndpoint.objects.select_for_update(no_key=True).filter(pk=endpoint.pk).values_list("pk")):
            return  # deleted during the run: its deliveries went with it
        copy_rows(WebhookAttempt._meta.db_table, _ATTEMPT_COLUMNS, [
            (t.delivery.pk, t.number, t.status, t.latency_ms, t.error, t.retry_at, t.at) for t in tried])
        with connection.cursor() as cur:
            cur.execute(_RECORD_SQL, [
                array_literal(t.delivery.pk for t in tried), array_literal(t.state for t in tried),
                array_literal(t.number for t in tried), array_literal(t.give_up_at.isoformat() for t in tried),
                array_literal((t.retry_at or t.at).isoformat() for t in tried),
                _array(t.status for t in tried), array_literal(t.error for t in tried),
                _array(t.at.isoformat() if t.state == State.DELIVERED else None for t in tried)])
        ok = [t for t in tried if t.state == State.DELIVERED]
        last = tried[-1]
        if ok:
            _endpoint_health(endpoint, True, "", ok[-1].at)
        if last.state != State.DELIVERED:
            _endpoint_health(endpoint, False, last.error, last.at)


def _endpoint_health(endpoint: WebhookEndpoint, ok: bool, error: str, now: datetime) -> None:
    """A success clears ``failing_since``; a failure sets it, and past ``DISABLE_AFTER_SECONDS``
    disables the endpoint with the reason shown in the admin and the API."""
    if ok:
        if endpoint.failing_since is not None:
            WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=None)
            endpoint.failing_since = None
        return
    since = endpoint.failing_since or now
    if endpoint.failing_since is None:
        WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(failing_since=now)
        endpoint.failing_since = now
    if (now - since).total_seconds() >= _conf("DISABLE_AFTER_SECONDS"):
        reason = (f"disabled automatically: no successful delivery since {since:%Y-%m-%d %H:%M}Z; "
                  f"last: {error}")[:500]
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=False, disabled_reason=reason, disabled_at=now)
        endpoint.active, endpoint.disabled_reason = False, reason
        log.warning("webhook endpoint %s disabled: %s", endpoint.pk, reason)


_TALLY = {str(State.DELIVERED): "delivered", str(State.FAILED): "failed"}
#: Attempts recorded together (one transaction): what a worker lost mid-run may post twice.
RECORD_EVERY = 50


#: Seconds a lease outlasts the last request a run may make (for recording the run's attempts).
LEASE_MARGIN_SECONDS = 5


def take(endpoint_id, now: datetime, seconds: float) -> uuid.UUID | None:
    """The endpoint's lease for ``seconds`` when it is idle and active: a token only its holder
    releases (one run per endpoint); None when another run holds it."""
    token = uuid.uuid4()
    idle = Q(busy_until__isnull=True) | Q(busy_until__lt=now)
    taken = WebhookEndpoint.objects.filter(idle, pk=endpoint_id, active=True).update(
        busy_until=now + timedelta(seconds=seconds), lease=token)
    return token if taken else None


def release(endpoint_id, token: uuid.UUID) -> None:
    """Free the endpoint if ``token`` still holds it (a run whose lease ran out frees nothing)."""
    WebhookEndpoint.objects.filter(pk=endpoint_id, lease=token).update(busy_until=None, lease=None)


def deliver_endpoint(endpoint_id) -> dict:
    """One run for one endpoint: its due deliveries, oldest first, a batch at a time while the batch
    budget lasts (a full batch delivered: the next is read), so a busy endpoint is not held to one batch
    a second. The run holds the endpoint's lease from ``now`` for budget + timeout + a margin, and
    starts no request after ``now`` + budget: each request ends by its timeout (a wall-clock
    deadline), so the run is over before its lease is, and no other run of the endpoint starts meanwhile."""
    now = clock.now()
    budget, timeout = _conf("BATCH_BUDGET_SECONDS"), _conf("TIMEOUT_SECONDS")
    size = int(_conf("BATCH_SIZE"))
    hold = budget + timeout + LEASE_MARGIN_SECONDS
    token = take(endpoint_id, now, hold)
    if token is None:
        return {"taken": False}
    done = {"taken": True, "delivered": 0, "failed": 0, "retrying": 0}
    try:
        endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
        deadline = now + timedelta(seconds=budget)
        signer = Webhook(endpoint.secret)
        conn: transport.Connection | None = None
        tried: list[Tried] = []
        try:
            while True:
                due = list(WebhookDelivery.objects.filter(endpoint=endpoint, state=State.PENDING,
                                                          next_attempt_at__lte=max(now, clock.now()))
                           .order_by("next_attempt_at", "created_at", "id")[:size])
                if not due:
                    break
                conn = conn or transport.Connection(endpoint.url, timeout)
                stopped = False
                for delivery in due:
                    if clock.now() >= deadline:
                        stopped = True
                        break
                    tried.append(attempt(delivery, conn, signer))
                    done[_TALLY.get(str(delivery.state), "retrying")] += 1
                    if delivery.state == State.PENDING:
                        stopped = True  # the endpoint is failing: the rest waits for the next run
                        break
                    if len(tried) >= RECORD_EVERY:
                        record(endpoint, tried)
                        tried = []
                if stopped or len(due) < size:
                    break
                record(endpoint, tried)  # the next read must not find these still pending
                tried = []
        finally:
            if conn is not None:
                conn.close()
            record(endpoint, tried)
    finally:
        release(endpoint_id, token)
    return done


def send_test(endpoint: WebhookEndpoint) -> WebhookDelivery:
    """``webhook.test`` to ``endpoint`` now (``POST /v1/webhook-endpoints/{id}/test``)."""
    at = clock.now()
    stamp = at.isoformat().replace("+00:00", "Z")
    delivery = WebhookDelivery.objects.create(endpoint=endpoint, event_type=TEST_EVENT, next_attempt_at=at,
                                              created_at=at, payload={"type": TEST_EVENT, "timestamp": stamp,
                                                                      "data": {"endpoint_id": str(endpoint.pk)}})
    if endpoint.active:
        transaction.on_commit(lambda: publish(endpoint.pk))
    return delivery


@dataclass(frozen=True)
class Replayed:
    """What a replay did: ``due`` made due now (their endpoint active: the next dispatch sends them);
    ``disabled`` of a disabled endpoint (``disabled_endpoints``, their URLs): pending with a fresh
    window, sent only once it is re-enabled; ``already_due`` pending and due already, unchanged."""

    due: int
    disabled: int
    already_due: int
    disabled_endpoints: list[str]


def replay(deliveries) -> Replayed:
    """Deliveries due again now with a fresh retry window (support, from the admin), and which of them
    will not go now and why (:class:`Replayed`)."""
    now = clock.now()
    chosen = WebhookDelivery.objects.filter(pk__in=[d.pk for d in deliveries])
    due_already = Q(state=State.PENDING, next_attempt_at__lte=now)
    with transaction.atomic():
        counts = chosen.aggregate(total=Count("pk"), disabled=Count("pk", filter=Q(endpoint__active=False)),
                                  already=Count("pk", filter=due_already & Q(endpoint__active=True)))
        disabled_urls = sorted(set(chosen.filter(endpoint__active=False).values_list("endpoint__url", flat=True)))
        chosen.exclude(due_already).update(state=State.PENDING, give_up_at=None, next_attempt_at=now)
    return Replayed(due=counts["total"] - counts["disabled"] - counts["already"], disabled=counts["disabled"],
                    already_due=counts["already"], disabled_endpoints=disabled_urls)

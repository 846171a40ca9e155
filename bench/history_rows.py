"""The rows of a history fill (bench/history.py): D days × N notifications a day as production leaves
them, with their attempts, timeline events, provider receipts, events, campaigns and API audit rows,
COPYed day by day into day partitions made before (never through DEFAULT); each notification to the
history table if the archiver has moved it by now (``HOT_HOURS`` and up to an hour after it
finished: its ``archived_at``) or the live one.
The mix (kinds, channels, outcomes per channel) is the tables below; docs/PERFORMANCE.md says it in words.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, models, transaction

from bench import seed
from campaigns.models import Campaign, CampaignStatus, Segment
from core import partitions
from notifications import ids
from notifications.events.models import Event, NotificationType
from notifications.models import APIAuditEntry, APIClient, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Recipient

HISTORY_TABLE = "notifications_notificationhistory"
SEGMENT = "bench-history"  # the fill's campaigns' segment (no members: the campaigns are history)
BLOCK = 20_000  # notifications per COPY round
PROVIDER = {"email": "sendgrid", "sms": "twilio", "push": "fcm"}
SEND_BATCH = {"email": 500, "sms": 1, "push": 1}  # rows sharing one provider message id (a SendGrid request)

# Outcomes per channel, per mille: (weight, status, reason, attempt outcomes, receipts, dead letter).
# Attempt outcomes are DeliveryAttempt.Outcome values, one row per provider call; receipts are the
# provider's raw event names (stored as ``receipt:<raw>`` events, as notifications/receipts.py does).
_T, _A = "transient", "accepted"
OUTCOMES = {
    "email": [(780, "delivered", "", (_A,), ("processed", "delivered"), False),
              (40, "delivered", "", (_T, _A), ("processed", "delivered"), False),
              (75, "sent", "", (_A,), ("processed",), False),
              (15, "failed", "provider_bounced", (_A,), ("processed", "bounce"), False),
              (5, "failed", "contact_invalid", ("contact_invalid",), (), False),
              (2, "failed", "attempts_exhausted", (_T,) * 5, (), True),
              (45, "suppressed", "opted_out_category", (), (), False),
              (10, "suppressed", "email_invalid", (), (), False),
              (15, "cancelled", "campaign_cancelled", (), (), False),
              (13, "expired", "ttl_expired", (_T,), (), False)],
    "sms": [(820, "delivered", "", (_A,), ("sent", "delivered"), False),
            (30, "delivered", "", (_T, _A), ("sent", "delivered"), False),
            (45, "sent", "", (_A,), ("sent",), False),
            (30, "failed", "provider_undelivered", (_A,), ("sent", "undelivered"), False),
            (10, "failed", "contact_invalid", ("contact_invalid",), (), False),
            (3, "failed", "attempts_exhausted", (_T,) * 5, (), True),
            (10, "suppressed", "sms_stopped", (), (), False),
            (20, "suppressed", "opted_out_channel", (), (), False),
            (7, "suppressed", "no_phone", (), (), False),
            (12, "cancelled", "cancelled_by_client", (), (), False),
            (13, "expired", "ttl_expired", (_T,), (), False)],
    "push": [(830, "sent", "", (_A,), (), False),
             (30, "sent", "", (_T, _A), (), False),
             (40, "failed", "contact_invalid", ("contact_invalid",), (), False),
             (2, "failed", "attempts_exhausted", (_T,) * 5, (), True),
             (20, "suppressed", "no_active_device", (), (), False),
             (45, "suppressed", "opted_out_category", (), (), False),
             (15, "cancelled", "campaign_cancelled", (), (), False),
             (18, "expired", "ttl_expired", (_T,), (), False)],
}
#: Send kinds, per mille of the notifications: campaign rows, API single sends, typed (event) rows.
KINDS = ((600, "campaign"), (250, "single"), (150, "typed"))
CAMPAIGN_CHANNELS = ((50, "email"), (35, "push"), (15, "sms"))
SINGLE_CHANNELS = ((45, "sms"), (45, "email"), (10, "push"))
TYPED_CHANNELS = ("push", "email")  # one event: the user's push and email (routing all)
TYPE_KEY = "bench_history_shipped"


def recipients_for(total: int) -> int:
    """Recipients of a fill of ``total`` notifications: reused across days (200 k at seed volume)."""
    return min(200_000, max(1_000, total // 20))


def _pick(weighted, r: float):
    total = sum(w for w, *_ in weighted)
    x = r * total
    for item in weighted:
        x -= item[0]
        if x < 0:
            return item
    return weighted[-1]


def table_exists(table: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return cur.fetchone()[0]


class _Table:
    """COPY rows of a model's columns into ``table``: a row starts as the fields' defaults."""

    def __init__(self, model: type[models.Model], table: str | None = None, extra: tuple[str, ...] = ()) -> None:
        fields = [f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField)]
        self.table = table or model._meta.db_table
        self.columns = [f.column for f in fields] + list(extra)  # ``extra``: values a caller appends to a row
        self.ix = {f.attname: i for i, f in enumerate(fields)}
        self.base = [_default(f) for f in fields]
        self.count = 0

    def row(self, **values) -> list:
        out = self.base.copy()
        ix = self.ix
        for key, value in values.items():
            out[ix[key]] = value
        return out

    def copy(self, rows: list[list]) -> None:
        if not rows:
            return
        with connection.cursor() as wrapper, wrapper.cursor.copy(
                f"COPY {self.table} ({', '.join(self.columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        self.count += len(rows)


def _default(field: models.Field):
    if field.db_default is not models.NOT_PROVIDED:
        value = getattr(field.db_default, "value", field.db_default)
    elif field.has_default():
        value = field.get_default()
    else:
        value = None if field.null else ""
    if isinstance(field, models.JSONField) and value is not None:
        return json.dumps(value)
    return value


class Filler:
    """One fill: the rows of ``days`` × ``per_day`` notifications before ``now``, COPYed day by day."""

    def __init__(self, days: int, per_day: int, now: datetime, progress: Callable[[str], None]) -> None:
        self.days, self.per_day, self.now, self.progress = days, per_day, now, progress
        self.rnd = random.Random(f"{days}x{per_day}")
        self.hot = timedelta(hours=settings.NOTIFY.get("HOT_HOURS", 6))
        self.live = _Table(Notification)
        self.history = (_Table(Notification, HISTORY_TABLE, extra=("archived_at",)) if table_exists(HISTORY_TABLE)
                        else None)
        self.attempts = _Table(DeliveryAttempt)
        self.events = _Table(DeliveryEvent)
        self.typed_events = _Table(Event)
        self.audit = _Table(APIAuditEntry)
        self.user_ids: list[str] = []
        self.campaigns = 0

    def fill(self) -> dict[str, int]:
        self.prepare()
        self.make_partitions()
        for day in range(self.days):
            start = self.now - timedelta(days=self.days - day)
            with transaction.atomic():
                self._day(start)
            self.progress(f"history: day {day + 1}/{self.days} written "
                          f"({self.live.count + (self.history.count if self.history else 0):,} notifications)")
        return self.written()

    def prepare(self, user_ids: list[str] | None = None) -> None:
        """The recipients (``user_ids``, default the fill's ``bh-…`` pool; made when missing), the API
        client, the event type and the campaigns' segment the rows name."""
        self.user_ids = user_ids or [f"bh-{i:07d}" for i in range(recipients_for(self.days * self.per_day))]
        with transaction.atomic():
            ends = [self.user_ids[0], self.user_ids[-1]]
            if Recipient.objects.filter(user_id__in=ends).count() != len(set(ends)):
                seed.ensure_recipients(self.user_ids, first_index=2 * 10**7)
            self.client, _key = APIClient.objects.create_key(name=f"bench-history-{uuid.uuid4().hex[:6]}",
                                                             allow_high=True)
            self.type, _ = NotificationType.objects.get_or_create(
                key=TYPE_KEY, defaults={"name": "Bench history: order shipped", "category": "shipping",
                                        "channels": list(TYPED_CHANNELS)})
            self.segment, _ = Segment.objects.get_or_create(segment_id=SEGMENT, defaults={"name": SEGMENT})

    def written(self) -> dict[str, int]:
        """Rows written so far, per table."""
        rows = {self.live.table: self.live.count}
        if self.history:
            rows[self.history.table] = self.history.count
        rows.update({t.table: t.count for t in (self.attempts, self.events, self.typed_events, self.audit)})
        rows[Campaign._meta.db_table] = self.campaigns
        return rows

    def make_partitions(self) -> None:
        """Each partitioned table's day partitions over the fill's days, made before the COPY: its rows
        land in them once, not in DEFAULT to be moved out by ``maintain()`` (every row written twice)."""
        first = (self.now - timedelta(days=self.days)).date()
        wanted = [first + timedelta(days=k) for k in range((self.now.date() - first).days + 1)]
        for table in partitions.registry():
            if not table_exists(table):
                continue
            column, have = partitions.key_column(table), set(partitions.days(table))
            for day in wanted:
                if day not in have:
                    partitions.create_day(table, column, day)

    # --- one day ---------------------------------------------------------------------------
    def _day(self, start: datetime) -> None:
        rnd, n = self.rnd, self.per_day
        counts = {kind: 0 for _w, kind in KINDS}
        for _ in range(n):
            counts[_pick(KINDS, rnd.random())[1]] += 1
        counts["typed"] -= counts["typed"] % 2  # events of two notifications each
        counts["single"] += n - sum(counts.values())
        self._campaigns(start, counts["campaign"])
        self.singles(start, counts["single"])
        self.typed(start, counts["typed"] // 2)

    def _campaigns(self, start: datetime, rows: int) -> None:
        if not rows:
            return
        size_max = int(len(self.user_ids) * 0.9)
        count = max(1, math.ceil(rows / size_max))
        for c in range(count):
            size = rows // count + (1 if c < rows % count else 0)
            channel = _pick(CAMPAIGN_CHANNELS, self.rnd.random())[1]
            launch = start + timedelta(seconds=self.rnd.uniform(0, 86_400 - 900))
            campaign = Campaign.objects.create(
                name=f"bench history {launch:%Y-%m-%d %H:%M}", client=self.client, segment=self.segment,
                channel=channel, title="Our news", body="Hello {{ first_name }}", status=CampaignStatus.COMPLETED,
                member_count=size, created_count=size, started_at=launch, fanned_out_at=launch + timedelta(minutes=2),
                completed_at=min(launch + timedelta(minutes=15), self.now - timedelta(seconds=1)))
            Campaign.objects.filter(pk=campaign.pk).update(created_at=launch, updated_at=campaign.completed_at)
            self.campaigns += 1
            make_id = ids.campaign_notification_ids(campaign.pk, channel)
            first = self.rnd.randrange(len(self.user_ids))
            batch: list[tuple] = []
            for i in range(size):
                user = self.user_ids[(first + i) % len(self.user_ids)]
                created = launch + timedelta(seconds=120 * i / size)
                batch.append((make_id(user), user, channel, created,
                               {"campaign_id": str(campaign.pk), "category": "marketing", "title": "Our news",
                                "body": f"Hello U{first + i}", "accepted_status": "queued"}))
                if len(batch) == BLOCK:
                    self._write(batch)
                    batch = []
            self._write(batch)

    def singles(self, start: datetime, rows: int, span_seconds: float = 86_400) -> None:
        """``rows`` API single sends made over ``span_seconds`` from ``start``, with their outcomes."""
        batch, audit = [], []
        client = str(self.client.pk)
        for _ in range(rows):
            channel = _pick(SINGLE_CHANNELS, self.rnd.random())[1]
            user = self.user_ids[self.rnd.randrange(len(self.user_ids))]
            created = start + timedelta(seconds=self.rnd.uniform(0, span_seconds))
            key = uuid.UUID(int=self.rnd.getrandbits(128)).hex
            nid = ids.single_send_id(client, key)
            high = channel != "push" and self.rnd.random() < 0.4  # OTPs and security codes
            batch.append((str(nid), user, channel, created,
                           {"client_id": client, "idempotency_key": key, "request_fingerprint": key[:64],
                            "priority": "high" if high else "standard", "sensitive": high,
                            "category": "security" if high else "account", "title": "" if high else "Your account",
                            "body": "Your code is 123456" if high else "Something changed",
                            "accepted_status": "queued"}))
            audit.append(self.audit.row(at=created, client_id=client, method="POST", path="/v1/notifications",
                                        object_type="notification", object_id=str(nid), status=202,
                                        fields=json.dumps(["recipient", "channel", "body"])))
            if len(batch) == BLOCK:
                self._write(batch)
                self.audit.copy(audit)
                batch, audit = [], []
        self._write(batch)
        self.audit.copy(audit)

    def typed(self, start: datetime, events: int) -> None:
        """``events`` typed events over the day from ``start``, each a push and an email."""
        batch, event_rows, audit = [], [], []
        client = str(self.client.pk)
        for _ in range(events):
            user = self.user_ids[self.rnd.randrange(len(self.user_ids))]
            created = start + timedelta(seconds=self.rnd.uniform(0, 86_400))
            key = uuid.UUID(int=self.rnd.getrandbits(128)).hex
            event = ids.event_id(client, key)
            data = {"order_id": key[:10]}
            event_rows.append(self.typed_events.row(
                id=str(event), client_id=client, idempotency_key=key, request_fingerprint=key[:64],
                type_id=TYPE_KEY, data=json.dumps(data), user_ids=json.dumps([user]),
                channels=json.dumps(list(TYPED_CHANNELS)), routing="all", created_at=created))
            audit.append(self.audit.row(at=created, client_id=client, method="POST", path="/v1/events",
                                        object_type="event", object_id=str(event), status=202,
                                        fields=json.dumps(["type", "users", "data"])))
            for channel in TYPED_CHANNELS:
                batch.append((str(ids.event_notification_id(event, user, channel)), user, channel, created,
                              {"event_id": str(event), "notification_type_id": TYPE_KEY, "category": "shipping",
                               "body": "", "data": json.dumps(data), "accepted_status": "queued"}))
            if len(batch) >= BLOCK:
                self._flush_typed(batch, event_rows, audit)
                batch, event_rows, audit = [], [], []
        self._flush_typed(batch, event_rows, audit)

    def _flush_typed(self, batch, event_rows, audit) -> None:
        self.typed_events.copy(event_rows)
        self.audit.copy(audit)
        self._write(batch)

    # --- rows of one block -----------------------------------------------------------------
    def _write(self, batch: list[tuple]) -> None:
        """COPY the notifications of ``batch`` (id, user, channel, created, fields) with their
        attempts and timeline events; each notification to history or live by when it finished."""
        live, history, attempts, events = [], [], [], []
        for index, (nid, user, channel, created, fields) in enumerate(batch):
            row, finished = self._notification(nid, user, channel, created, fields, index, attempts, events)
            # The archiver's run that moves it: HOT_HOURS after it finished, up to an hour more.
            archived = finished + self.hot + timedelta(seconds=self.rnd.uniform(0, 3_600))
            if self.history is not None and archived < self.now:
                history.append([*row, archived])
            else:
                live.append(row)
        self.live.copy(live)
        if self.history is not None:
            self.history.copy(history)
        self.attempts.copy(attempts)
        self.events.copy(events)

    def _notification(self, nid, user, channel, created, fields, index, attempts, events):
        rnd = self.rnd
        _w, status, reason, calls, receipts, dead = _pick(OUTCOMES[channel], rnd.random())
        provider = PROVIDER[channel]
        ceiling = self.now - timedelta(seconds=1)
        t = min(created + timedelta(milliseconds=rnd.uniform(50, 2_000)), ceiling)  # queued → first call
        if "client_id" in fields or "event_id" in fields:
            events.append(self.events.row(notification_id=nid, kind="accepted", status="queued", created_at=created))
        pmid = ""
        if calls and calls[-1] == _A:
            batch_id = index // SEND_BATCH[channel] if channel == "email" and "campaign_id" in fields else None
            pmid = _message_id(provider, nid if batch_id is None else f"{fields['campaign_id']}:{batch_id}")
        first_call = t if calls else None
        for number, outcome in enumerate(calls, start=1):
            accepted = outcome == _A
            attempts.append(self.attempts.row(
                notification_id=nid, number=number, provider=provider, outcome=outcome,
                error_code="" if accepted else ("429" if outcome == _T else "invalid_contact"),
                http_status=202 if accepted else (429 if outcome == _T else 400), latency_ms=rnd.randrange(20, 400),
                provider_message_id=pmid if accepted else "", created_at=t))
            if outcome == _T and number < len(calls):
                events.append(self.events.row(notification_id=nid, kind="retry", status="scheduled",
                                              reason="retry_scheduled", created_at=t))
                t = min(t + timedelta(seconds=rnd.uniform(5, 120)), ceiling)
                events.append(self.events.row(notification_id=nid, kind="released", status="queued", created_at=t))
        sent_at = t if pmid else None
        delivered_at = receipt_at = None
        for raw in receipts:
            t = min(t + timedelta(seconds=rnd.uniform(1, 30)), ceiling)
            events.append(self.events.row(notification_id=nid, kind=f"receipt:{raw}", detail="",
                                          dedup_key=f"{provider}:{uuid.UUID(int=rnd.getrandbits(128)).hex}",
                                          created_at=t))
            receipt_at = t
            if raw == "delivered":
                delivered_at = t
        if status in ("suppressed", "cancelled", "expired") or dead:
            kind = {"suppressed": "suppressed", "cancelled": "cancelled", "expired": "expired"}.get(status,
                                                                                                    "dead_lettered")
            events.append(self.events.row(notification_id=nid, kind=kind, status=status, reason=reason,
                                          created_at=t))
        terminal_receipt = status in ("delivered", "failed") and bool(receipts)
        row = self.live.row(
            id=nid, recipient_id=user, channel=channel, status=status, reason=reason,
            reason_detail=f"bench history: {reason}" if reason else "",
            queued_at=created, attempts=len(calls), claims=len(calls), first_attempt_at=first_call,
            provider=provider if calls else "", provider_message_id=pmid, sent_at=sent_at,
            delivered_at=delivered_at, receipt_at=receipt_at if terminal_receipt else None,
            dead_lettered_at=t if dead else None, created_at=created, updated_at=t,
            expires_at=t if status == "expired" else None, **fields)
        return row, t


def _message_id(provider: str, name: str) -> str:
    """The provider's message id, as it looks on the wire (docs/PROVIDERS.md)."""
    digest = uuid.uuid5(uuid.NAMESPACE_URL, name).hex
    if provider == "twilio":
        return f"SM{digest}"
    if provider == "fcm":
        return f"projects/bench/messages/0:{digest}"
    return digest[:22]  # SendGrid's X-Message-Id of the request

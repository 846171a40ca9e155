"""The state machine of tests/test_lifecycle_stateful.py (its docstring says what it drives and
checks): seven notifications, every writer of their status as a rule, the invariants."""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from django.db import transaction
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from campaigns import tally
from campaigns.models import Campaign, CampaignStatus, Segment
from campaigns.selectors import campaign_counts, counted_rows, counts_for, counts_of
from campaigns.services import CampaignNotCancellable, cancel_campaign
from core import clock
from notifications import receipts, scheduler, sent_markers
from notifications.app_receipts import NotReached, apply_app_receipt
from notifications.campaign_rows import CampaignRow, insert_campaign_page
from notifications.delivery import checks, claim, load, pipeline, record
from notifications.delivery.outcomes import attempt_row, decide
from notifications.delivery.types import Decided, Row
from notifications.events import services as events
from notifications.events.models import Event, NotificationType
from notifications.models import DeliveryEvent, Notification, Reason, TimelineEntry
from notifications.services import NotCancellable, cancel_notification, replay_dead_letters
from preferences.models import Recipient
from providers.base import ContactInvalidError, PermanentProviderError, SendResult, TransientProviderError
from providers.sendgrid.webhooks import to_receipt
from tests.conftest import make_client
from tests.lifecycle_oracle import EDGES, REACHED_FINAL, TERMINAL, S, in_the_codes_table, moves_legally, race
from tests.test_webhooks import twilio_post

NOW = datetime(2031, 6, 2, 8, 0, tzinfo=UTC)

# --- the world ----------------------------------------------------------------------------------

CLOCK = [NOW]


class Seen(SimpleNamespace):
    """A row as the invariants last saw it: ``status``, ``reason``, ``dead_lettered``."""


#: The rows of one example: name → channel. ``sms*`` and ``push`` are single sends, ``camp_*`` and
#: ``in_app`` campaign rows, ``fb_*`` an event's fallback pair.
ROWS = {"sms_sent": "sms", "push": "push", "sms": "sms", "in_app": "in_app", "camp_a": "email", "camp_b": "email",
        "fb_email": "email", "fb_sms": "sms"}
#: Rows a worker sent before the machine starts: receipts and races have targets from the first step.
SENT_BEFORE = ("sms_sent", "push")
CAMPAIGN_ROWS = {"email": ["camp_a", "camp_b"], "in_app": ["in_app"]}
#: The in-app campaign's time to live: a few of the machine's due-release steps run it out.
IN_APP_TTL = timedelta(minutes=3)
SENT_BY_WORKER = sorted((name for name, channel in ROWS.items() if channel != "in_app"), key=SENT_BEFORE.__contains__)
SMS_ROWS = [name for name, channel in ROWS.items() if channel == "sms"]
EMAIL_ROWS = [name for name, channel in ROWS.items() if channel == "email"]
APP_ROWS = ["push", "in_app"]
PROVIDER_OF = {"sms": "twilio", "email": "sendgrid", "push": "fcm"}

#: What a provider call ends with: accepted, or the error the backend raises.
CALL_OUTCOMES = ["accepted", "accepted", "timeout_accepted", "timeout_lost", "unavailable", "refused",
                 "contact_invalid"]
# The moves first: Hypothesis draws the first items of a list more often.
TWILIO_STATUSES = [("delivered", ""), ("undelivered", "30008"), ("sent", ""), ("failed", "30003")]
SENDGRID_EVENTS = ["delivered", "bounce", "processed", "dropped"]


def _call_outcome(word: str, provider: str, message_id: str):
    return {"accepted": lambda: SendResult(provider, message_id),
            "timeout_accepted": lambda: TransientProviderError(provider, "timeout", "no answer in time"),
            "timeout_lost": lambda: TransientProviderError(provider, "timeout", "no answer in time"),
            "unavailable": lambda: TransientProviderError(provider, "503", "unavailable", http_status=503),
            "refused": lambda: PermanentProviderError(provider, "400", "bad payload", http_status=400),
            "contact_invalid": lambda: ContactInvalidError(provider, "21211", "invalid number",
                                                           reason="invalid_number")}[word]()


class Lifecycle(RuleBasedStateMachine):
    """Seven notifications and every writer of their state (tests/test_lifecycle_stateful.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.pk: dict[str, uuid.UUID] = {}
        # Workers with a call made and not recorded yet: (name, row as claimed, outcome, when, claim number).
        self.inflight: list[tuple] = []
        self.at_provider: dict[str, list[str]] = {name: [] for name in ROWS}  # message ids the provider has
        self.claims = dict.fromkeys(ROWS, 0)  # successful claims of each row, in order
        self.seen: dict[str, Seen] = {}
        self.timeline_seen: dict[str, set] = {}
        self.terminal: dict[str, str | None] = {}  # the end each row shows, if any
        self.moves = 1
        self.sequence = 0

    # --- setup and teardown ---------------------------------------------------------------------

    @initialize()
    def make_rows(self) -> None:
        tag = uuid.uuid4().hex[:8]
        CLOCK[0] += timedelta(hours=1)
        now = clock.now()
        self.tag = tag
        self.recipients = [Recipient.objects.create(user_id=f"st-{tag}-{i}", email=f"st{tag}{i}@example.org",
                                                    phone=f"+1555{int(tag, 16) % 10**6:06d}{i}") for i in range(3)]
        alice, bob, carol = self.recipients
        for name in ("sms", "sms_sent", "push"):
            sent = name in SENT_BEFORE
            message_id = self._message_id(name) if sent else ""
            n = Notification.objects.create(
                id=uuid.uuid4(), recipient=alice, channel=ROWS[name], body=f"{name} body", title="Hi",
                status=S.SENT if sent else S.QUEUED, queued_at=now, created_at=now, updated_at=now,
                attempts=int(sent), provider=PROVIDER_OF[ROWS[name]] if sent else "", provider_message_id=message_id,
                sent_at=now if sent else None)
            self.pk[name] = n.pk
            if sent:
                self.at_provider[name].append(message_id)
        # An email campaign of two rows and an in-app campaign of one, made as fan-out makes them
        # (the in-app row's content is rendered at send time by the campaigns app).
        segment = Segment.objects.create(segment_id=f"st-{tag}", name="stateful")
        self.campaigns = {channel: Campaign.objects.create(segment=segment, channel=channel, title="News",
                                                           body="Hello", status=CampaignStatus.SENDING,
                                                           created_count=len(names))
                          for channel, names in CAMPAIGN_ROWS.items()}
        with transaction.atomic():
            for channel, names in CAMPAIGN_ROWS.items():
                for name in names:
                    self.pk[name] = uuid.uuid4()
                insert_campaign_page(campaign_id=self.campaigns[channel].pk, channel=channel, priority="standard",
                                     category="marketing", now=now, rows=[
                                         CampaignRow(self.pk[name], member.pk, S.QUEUED, "", now,
                                                     now + IN_APP_TTL if channel == "in_app" else None)
                                         for name, member in zip(names, (alice, bob), strict=False)])
        # An event of a fallback type: email first, SMS waiting behind it.
        kind = NotificationType.objects.create(key=f"st_{tag}", name="Stateful", category="account",
                                               channels=["email", "sms"], routing="fallback")
        self.client, _key = make_client("stateful")
        event = Event.objects.create(id=uuid.uuid4(), client=self.client, type=kind, user_ids=[carol.pk],
                                     channels=["email", "sms"], routing="fallback")
        first = Notification.objects.create(id=uuid.uuid4(), recipient=carol, channel="email", body="Your order",
                                            title="Order", event=event, notification_type=kind, category="account",
                                            status=S.QUEUED, queued_at=now, created_at=now, updated_at=now)
        second = Notification.objects.create(id=uuid.uuid4(), recipient=carol, channel="sms", body="Your order",
                                             event=event, notification_type=kind, category="account",
                                             fallback_after=first.pk, status=S.SCHEDULED,
                                             reason=Reason.FALLBACK_WAITING, created_at=now, updated_at=now)
        self.pk["fb_email"], self.pk["fb_sms"] = first.pk, second.pk
        DeliveryEvent.objects.bulk_create([
            DeliveryEvent(notification_id=pk, kind="accepted", status=Notification.objects.get(pk=pk).status,
                          created_at=now) for pk in self.pk.values()])
        for name in ROWS:
            self.seen[name] = self._read(name)
            self.timeline_seen[name] = set(TimelineEntry.objects.filter(notification_id=self.pk[name])
                                           .values_list("id", flat=True))
            self.terminal[name] = self.seen[name].status if self.seen[name].status in TERMINAL else None

    def teardown(self) -> None:
        claim.release(list(self.pk.values()))
        ids = list(self.pk.values())
        Notification.objects.filter(pk__in=ids).delete()
        Event.objects.filter(type__key=f"st_{getattr(self, 'tag', '')}").delete()
        NotificationType.objects.filter(key=f"st_{getattr(self, 'tag', '')}").delete()
        if hasattr(self, "campaigns"):
            Campaign.objects.filter(pk__in=[c.pk for c in self.campaigns.values()]).delete()
            Segment.objects.filter(segment_id=f"st-{self.tag}").delete()
        for r in getattr(self, "recipients", []):
            Recipient.objects.filter(pk=r.pk).delete()
        if hasattr(self, "client"):
            self.client.delete()

    # --- helpers --------------------------------------------------------------------------------

    def _read(self, name: str) -> Seen:
        n = Notification.objects.get(pk=self.pk[name])
        return Seen(status=n.status, reason=n.reason, dead_lettered=n.dead_lettered_at is not None)

    def _tick(self, seconds: float = 1.0) -> None:
        CLOCK[0] += timedelta(seconds=seconds)

    def _message_id(self, name: str) -> str:
        self.sequence += 1
        if ROWS[name] == "sms":
            return f"SM{self.tag}{self.sequence:024d}"
        if ROWS[name] == "email":
            return f"sg{self.tag}{self.sequence:06d}"
        return f"projects/p/messages/{self.tag}-{self.sequence}"

    def _claim_and_call(self, name: str, word: str):
        """A worker's claim stage, its sent-marker check and its provider call, whose accepted answer
        writes the sent marker at once as the calls stage does (the record comes later: :meth:`record`)."""
        now = clock.now()
        claimed = claim.claim([str(self.pk[name])], now)
        # A stalled worker's lease is never renewed here: only :meth:`leases_run_out` moves leases, on
        # the machine's clock (the keeper renews on real time: under load it outran the steps in CI).
        claim.release(claimed)
        if not claimed:  # kept as a worker with nothing to record, so the machine's steps never depend on it
            self.inflight.append((name, None, None, now, None))
            return None
        self.claims[name] += 1
        (n,) = load.rows(claimed)
        if claim.sent_markers(claimed):  # an earlier call was accepted: recorded sent, no call (pipeline.prepare)
            pipeline._apply(n, checks.MARKER_FOUND, now)
            self.inflight.append((name, None, None, now, None))
            return None
        message_id = self._message_id(name)
        if word in ("accepted", "timeout_accepted"):
            self.at_provider[name].append(message_id)
        if word == "accepted":
            sent_markers.mark_sent([n.pk])
        entry = (name, n, _call_outcome(word, PROVIDER_OF[ROWS[name]], message_id), now, self.claims[name])
        self.inflight.append(entry)
        return entry

    def _record(self, entry, *, alone: bool = False) -> None:
        """The outcomes and record stages for one worker's call, then the claim released. ``alone``:
        no other writer runs meanwhile, so what changed is this record's doing."""
        name, n, outcome, ended, claim_number = entry
        if n is None:
            return
        before = self._read(name)
        decision = decide(n, [outcome], planned=1, devices=1, waiting=None, now=clock.now())
        errors = [(outcome, None)] if isinstance(outcome, Exception) else []
        record.record([Decided(Row(n), decision, [attempt_row(n, outcome, None, 40, ended)], errors)], n.channel,
                      n.priority,
                      {n.pk} if decision.action == "sent" else frozenset())
        claim.release([n.pk])
        after = self._read(name)
        if alone and claim_number != self.claims[name]:
            assert after.status == before.status, (
                f"{name}: a stale worker (claim {claim_number}; the row was claimed {self.claims[name]} times) "
                f"recorded over a later claim: {before.status} → {after.status} ({after.reason})")
        if decision.action == "sent":
            # Waiting to be claimed again with its marker: the claim records it sent, no second call.
            waiting = after.status in (S.SCHEDULED, S.QUEUED) and sent_markers.find_sent([n.pk])
            failed_later = after.status == S.FAILED and after.reason in (Reason.PROVIDER_UNDELIVERED,
                                                                          Reason.PROVIDER_BOUNCED)
            assert waiting or after.status in (S.SENT, *REACHED_FINAL) or failed_later, (
                f"{name}: its worker recorded an accepted call (attempt {n.attempts}) and the row is "
                f"{after.status} ({after.reason}): the acceptance was lost (the provider has the message)")

    def _twilio(self, name: str, status: str, code: str):
        sid = self.at_provider[name][-1]
        target = SimpleNamespace(pk=self.pk[name], provider_message_id=sid)
        return lambda: twilio_post(target, status, code=code).status_code

    def _sendgrid(self, name: str, event: str, seconds_ago: int):
        message_id = self.at_provider[name][-1]
        n = Notification.objects.select_related("recipient").get(pk=self.pk[name])
        payload = {"event": event, "email": n.recipient.email, "sg_message_id": f"{message_id}.filter0001",
                   "notification_id": str(n.pk), "timestamp": int(clock.now().timestamp()) - seconds_ago}
        if event == "bounce":
            payload.update(type="bounce", status="5.1.1", reason="550 5.1.1 unknown user")
        elif event == "dropped":
            payload["reason"] = "Bounced Address"
        return lambda: receipts.apply_receipts([to_receipt(payload)])

    def _app(self, name: str, event: str):
        def apply():
            try:
                return apply_app_receipt(Notification.objects.filter(pk=self.pk[name]), event).status_changed
            except NotReached as exc:
                return exc.code
        return apply

    # --- rules: workers -------------------------------------------------------------------------

    @rule(name=st.sampled_from(SENT_BY_WORKER), word=st.sampled_from(CALL_OUTCOMES))
    def claim_and_call(self, name, word):
        self._tick()
        self.moves = 2  # a claim that finds the sent marker records the row sent at once
        self._claim_and_call(name, word)

    @precondition(lambda self: self.inflight)
    @rule(index=st.integers(0, 5))
    def record(self, index):
        self._tick()
        self._record(self.inflight.pop(index % len(self.inflight)), alone=True)

    @rule()
    def send_in_app(self):
        """The in-app channel through the whole pipeline: claim, checks, the inbox write, record."""
        self._tick()
        self.moves = 2  # queued → sending → sent
        pipeline.send_notifications([str(self.pk["in_app"])])

    @rule()
    def in_app_worker_dies(self):
        """A worker claims the in-app row and dies before its checks (its lease will run out)."""
        self._tick()
        claim.claim([str(self.pk["in_app"])], clock.now())
        claim.release([self.pk["in_app"]])

    # --- rules: scheduler -----------------------------------------------------------------------

    @rule()
    def leases_run_out(self):
        """The workers of rows in flight stalled: the reconciler takes them over (and sweeps fallbacks)."""
        self._tick(31)
        scheduler.reconcile()

    @rule()
    def due_rows_released(self):
        self._tick(60)
        scheduler.release_due()

    # --- rules: receipts ------------------------------------------------------------------------

    @rule(name=st.sampled_from(SMS_ROWS), status=st.sampled_from(TWILIO_STATUSES))
    def twilio_receipt(self, name, status):
        if not self.at_provider[name]:
            return
        self._tick()
        assert self._twilio(name, *status)() == 204

    @rule(name=st.sampled_from(EMAIL_ROWS), event=st.sampled_from(SENDGRID_EVENTS), seconds_ago=st.integers(0, 30))
    def sendgrid_receipt(self, name, event, seconds_ago):
        if not self.at_provider[name]:
            return
        self._tick()
        self._sendgrid(name, event, seconds_ago)()

    @rule(name=st.sampled_from(APP_ROWS), event=st.sampled_from(["displayed", "opened", "dismissed"]))
    def app_receipt(self, name, event):
        self._tick()
        self.moves = 2  # a row whose call was never recorded: settled as sent, then moved up (app_receipts.py)
        self._app(name, event)()

    # --- rules: people --------------------------------------------------------------------------

    @rule(name=st.sampled_from(list(ROWS)))
    def client_cancels(self, name):
        self._tick()
        with contextlib.suppress(NotCancellable):
            cancel_notification(self.pk[name])

    @rule(channel=st.sampled_from(list(CAMPAIGN_ROWS)))
    def campaign_cancelled(self, channel):
        self._tick()
        with contextlib.suppress(CampaignNotCancellable):
            cancel_campaign(self.campaigns[channel].pk)

    @rule()
    def event_cancelled(self):
        self._tick()
        with contextlib.suppress(events.NotCancellable):
            events.cancel_event(Event.objects.get(type__key=f"st_{self.tag}"))

    @rule(name=st.sampled_from(SENT_BY_WORKER))
    def dead_letter_replayed(self, name):
        self._tick()
        replay_dead_letters([self.pk[name]], by="stateful test")

    # --- rules: two writers at once -------------------------------------------------------------

    @rule(name=st.sampled_from(SMS_ROWS), first=st.sampled_from(TWILIO_STATUSES),
          second=st.sampled_from(TWILIO_STATUSES))
    def two_twilio_receipts_race(self, name, first, second):
        """The issue's race: two receipt processes apply two callbacks of one message at once."""
        if not self.at_provider[name]:
            return
        self._tick()
        self.moves = 2
        assert race(self._twilio(name, *first), self._twilio(name, *second)) == [204, 204]

    @rule(name=st.sampled_from(EMAIL_ROWS), first=st.sampled_from(SENDGRID_EVENTS),
          second=st.sampled_from(SENDGRID_EVENTS))
    def two_sendgrid_receipts_race(self, name, first, second):
        if not self.at_provider[name]:
            return
        self._tick()
        self.moves = 2
        race(self._sendgrid(name, first, 5), self._sendgrid(name, second, 1))

    @precondition(lambda self: self.inflight)
    @rule(index=st.integers(0, 5), twilio=st.sampled_from(TWILIO_STATUSES), sendgrid=st.sampled_from(SENDGRID_EVENTS),
          app=st.sampled_from(["displayed", "opened"]))
    def record_races_a_receipt(self, index, twilio, sendgrid, app):
        """A worker records its call while the provider's (or the app's) receipt for it is applied."""
        entry = self.inflight.pop(index % len(self.inflight))
        name = entry[0]
        self._tick()
        self.moves = 3
        if ROWS[name] == "sms" and self.at_provider[name]:
            other = self._twilio(name, *twilio)
        elif ROWS[name] == "email" and self.at_provider[name]:
            other = self._sendgrid(name, sendgrid, 0)
        elif name in APP_ROWS:
            other = self._app(name, app)
        else:
            other = scheduler.reconcile
        race(lambda: self._record(entry), other)

    @precondition(lambda self: self.inflight)
    @rule(index=st.integers(0, 5))
    def record_races_the_reconciler(self, index):
        """A stalled worker records just as the reconciler takes its row over."""
        entry = self.inflight.pop(index % len(self.inflight))
        self._tick(31)
        self.moves = 2
        race(lambda: self._record(entry), scheduler.reconcile)

    @rule(name=st.sampled_from(SENT_BY_WORKER))
    def claim_races_a_cancel(self, name):
        """A worker claims the row as the client cancels it; the worker then dies before its call
        (which of the two won must not change what the machine knows: Hypothesis replays examples)."""
        self._tick()
        claimed, _cancelled = race(lambda: claim.claim([str(self.pk[name])], clock.now()),
                                   lambda: cancel_notification(self.pk[name]))
        self.claims[name] += bool(claimed)
        claim.release([self.pk[name]])

    @rule(name=st.sampled_from(SENT_BY_WORKER))
    def replay_races_a_receipt(self, name):
        """A dead letter is replayed as a late receipt (or the app's) says it arrived after all."""
        if not self.at_provider[name]:
            return
        self._tick()
        self.moves = 2
        if ROWS[name] == "sms":
            other = self._twilio(name, "delivered", "")
        elif ROWS[name] == "email":
            other = self._sendgrid(name, "delivered", 0)
        else:
            other = self._app(name, "displayed")
        race(lambda: replay_dead_letters([self.pk[name]], by="stateful test"), other)

    @rule(first=st.sampled_from(["displayed", "opened", "dismissed"]),
          second=st.sampled_from(["displayed", "opened", "dismissed"]))
    def two_app_receipts_race(self, first, second):
        self._tick()
        self.moves = 3
        race(self._app("push", first), self._app("push", second))

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def every_row_moved_legally_with_its_timeline_entry(self) -> None:
        if not self.pk:
            return
        moves, self.moves = self.moves, 1
        problems = []
        for name in ROWS:
            before, after = self.seen[name], self._read(name)
            entries = {e.id: e for e in TimelineEntry.objects.filter(notification_id=self.pk[name])}
            new = [entries[i] for i in sorted(set(entries) - self.timeline_seen[name], key=lambda i: (
                entries[i].created_at, i))]
            if not in_the_codes_table(before.status, after.status, moves):
                problems.append(f"{name}: {before.status} → {after.status}: not in notifications/lifecycle/table.py")
            if not moves_legally(before, after.status, moves):
                problems.append(f"{name}: moved backwards or off the table: {before.status} ({before.reason}) → "
                                f"{after.status} ({after.reason})")
            if after.status != before.status and after.status != S.SENDING and after.status not in {
                    e.status for e in new}:
                problems.append(f"{name}: {before.status} → {after.status} with no timeline entry saying "
                                f"{after.status} (new entries: {[(e.kind, e.status) for e in new]})")
            if after.status not in TERMINAL:  # left its end: by a documented exit, or flagged above
                self.terminal[name] = None
            elif after.status != self.terminal[name]:
                ended = self.terminal[name]
                documented = (ended, after.status) in EDGES  # a provider's later word (Receipt order)
                if ended is not None and TERMINAL[ended] != TERMINAL[after.status] and not documented:
                    problems.append(f"{name}: a second end: {ended}, then {after.status} ({after.reason})")
                self.terminal[name] = after.status
            self.seen[name] = after
            self.timeline_seen[name] = set(entries)
        assert not problems, "\n".join(problems)

    @invariant()
    def campaign_counts_equal_the_rows(self) -> None:
        """And the pace sampler's tallies (campaigns/tally.py), kept from what each writer's statements
        changed, equal the full count after every step, as the readers take them (the tally and the
        changes not folded yet, campaigns.selectors.counts_for) and once folded."""
        if not self.pk:
            return
        campaigns = list(self.campaigns.values())
        read = counts_for(campaigns)  # the readers' counts: a tally and the changes not folded yet
        with transaction.atomic():
            assert tally.lock()
            tallied = tally.counts(campaigns, CLOCK[0])
        for campaign in campaigns:
            rows = Counter(Notification.objects.filter(campaign_id=campaign.pk).values_list("status", flat=True))
            counts = counts_of(counted_rows(campaign.pk), campaign)  # the full count
            assert tallied[campaign.pk] == counts == read[campaign.pk] == campaign_counts(campaign)
            assert counts["total"] == sum(rows.values()) == campaign.created_count
            assert {s: n for s, n in counts["by_status"].items() if n} == dict(rows)
            outcome = counts["outcome"]
            assert outcome["sent"] + outcome["not_sent"] + outcome["pending"] == campaign.created_count
            assert outcome["sent"] == sum(rows[s] for s in (S.SENT, *REACHED_FINAL))

    @invariant()
    def no_writer_crashed(self) -> None:
        """The pipeline records a crash of its own stages as ``worker_error`` (retried, then a dead
        letter): none of the machine's steps is a reason to crash."""
        if not self.pk:
            return
        crashed = list(DeliveryEvent.objects.filter(notification_id__in=self.pk.values(), reason=Reason.WORKER_ERROR)
                       .values_list("notification_id", "detail"))
        assert not crashed, f"a worker crashed: {crashed}"

"""The one way in (docs/ARCHITECTURE.md §6, "Roads in"): every road of the registry
(:data:`notifications.admission.ROADS`) is driven here, and each must pass the gate, and each rule
the gate applies on it must hold there: the high gate, the abuse limits, idempotency, the content
limits. A road added to the registry without a driver here fails; so does a module that writes
notification rows outside the registered roads."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from django.utils.module_loading import import_string
from rest_framework.exceptions import ValidationError

from campaigns.models import Campaign, CampaignStatus
from core import clock
from core.api.refusals import AcceptanceLimited, MissingScope
from notifications import admission
from notifications.admission import ROADS, RULES, Road, Rule
from notifications.events import digests, fallback
from notifications.events import services as event_services
from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import APIClient, DeliveryEvent, Notification, Status
from notifications.services import accept_notification, replay_dead_letters
from tests.conftest import make_client
from tests.fanout_helpers import make_recipient, make_segment_of, run_fan_out

pytestmark = pytest.mark.django_db

PHONE = "+4915199990000"
#: Production's abuse limits, and a category rule so untyped sends are counted too.
LIMITS = [
    {"name": "otp_per_phone", "match": {"type": "otp"}, "per": "phone", "limit": 10, "window_seconds": 600},
    {"name": "security_per_phone", "match": {"category": "security"}, "per": "phone", "limit": 10,
     "window_seconds": 600},
]


@pytest.fixture(autouse=True)
def limits(settings):
    settings.NOTIFY = {**settings.NOTIFY, "ACCEPTANCE_LIMITS": LIMITS}


@pytest.fixture
def sharing():
    """15 users sharing one phone."""
    return [make_recipient(f"share-{i:02d}", phone=PHONE) for i in range(15)]


def a_type(key: str, *, priority: str = "high", client: APIClient | None = None, **over) -> NotificationType:
    fields = {"name": key, "category": "security", "channels": ["sms"], "priority": priority, "client": client,
              **over}
    kind = NotificationType.objects.create(key=key, **fields)
    for channel in fields["channels"]:
        TypeTemplate.objects.create(type=kind, channel=channel, locale="en", title="Code",
                                    body="Your code is {{ data.code }}")
    return kind


def no_high() -> APIClient:
    return make_client(allow_high=False)[0]


def high() -> APIClient:
    return make_client(allow_high=True)[0]


# --- one driver per road: makes (or releases) notifications on it, returns them --------------------

def single(client, recipient, *, key=None, priority="standard", body="Your code is 313131"):
    return [accept_notification(client=client, idempotency_key=key or uuid.uuid4().hex, fingerprint="f",
                                recipient=recipient, channel="sms", priority=priority, content={"body": body},
                                category="security").notification]


def typed(client, recipient, kind, *, key=None):
    return event_services.accept_event(client=client, idempotency_key=key or uuid.uuid4().hex, fingerprint="f",
                                       kind=kind, recipients=[recipient], data={"code": "1"},
                                       channel="sms").notifications


def event(client, recipients, kind, *, key=None):
    return event_services.accept_event(client=client, idempotency_key=key or uuid.uuid4().hex, fingerprint="f",
                                       kind=kind, recipients=list(recipients), data={"code": "1"}).notifications


def campaign(client, user_ids, kind=None, *, priority="standard"):
    """A campaign as stored, whatever made it (the API, the admin, or before a rule existed)."""
    c = Campaign.objects.create(client=client, segment=make_segment_of(user_ids), channel="sms",
                                priority=kind.priority if kind else priority,
                                category=kind.category if kind else "security", notification_type=kind,
                                data={"code": "313131"} if kind else None, body="" if kind else "Hi",
                                status=CampaignStatus.SCHEDULED, fanout_at=clock.now())
    return run_fan_out(c)


def digest(client, recipient):
    kind = a_type("likes", priority="standard", category="social",
                  digest={"window_seconds": 60, "key": "{{ data.post }}"})
    event_services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                                recipients=[recipient], data={"post": "p1"})
    (d,) = digests.Digest.objects.filter(recipient=recipient)
    with_lock = digests.Digest.objects.get(pk=d.pk)
    return digests.close(with_lock, d.closes_at)


def fallback_release(client, recipient):
    kind = a_type("reach", priority="standard", category="account", channels=["push", "sms"], routing="fallback")
    first, second = event(client, [recipient], kind)
    Notification.objects.filter(pk=first.pk).update(status=Status.SUPPRESSED, reason="no_active_device")
    fallback.settle([(first.pk, Status.SUPPRESSED, "no_active_device", "push")])
    return list(Notification.objects.filter(pk=second.pk, status=Status.QUEUED))


def dead_letter(recipient, body="Your code is 313131") -> Notification:
    (n,) = single(high(), recipient, body="x")
    Notification.objects.filter(pk=n.pk).update(status=Status.FAILED, dead_lettered_at=clock.now(), body=body)
    return n


def replay(recipient, body="Your code is 313131"):
    n = dead_letter(recipient, body)
    replay_dead_letters([n.pk], by="staff")
    return list(Notification.objects.filter(pk=n.pk, status=Status.QUEUED))


DRIVERS = {
    Road.SINGLE: lambda r: single(high(), r),
    Road.TYPED: lambda r: typed(high(), r, a_type("otp")),
    Road.EVENT: lambda r: event(high(), [r], a_type("otp")),
    Road.CAMPAIGN: lambda r: campaign(high(), [r.user_id], a_type("otp")),
    Road.DIGEST: lambda r: digest(high(), r),
    Road.FALLBACK: lambda r: fallback_release(high(), r),
    Road.REPLAY: lambda r: replay(r),
}


class Seen(dict):
    """:data:`admission.RULES` that records which roads asked for their rules (every :func:`admit`)."""

    def __init__(self, rules) -> None:
        super().__init__(rules)
        self.asked: list[Road] = []

    def __getitem__(self, road):
        self.asked.append(road)
        return super().__getitem__(road)


def test_every_road_of_the_registry_has_a_driver_and_every_road_has_rules():
    assert set(DRIVERS) == set(ROADS) == set(Road) == set(RULES)
    for path in ROADS.values():
        assert callable(import_string(path))


@pytest.mark.parametrize("road", list(Road))
def test_each_road_passes_the_gate(road, monkeypatch):
    seen = Seen(admission.RULES)
    monkeypatch.setattr(admission, "RULES", seen)
    made = DRIVERS[road](make_recipient(f"gate-{road}"))
    assert len(made) == 1  # the road made (or released) its notification…
    assert road in seen.asked  # …through the gate, under its own name


def test_the_rules_run_in_one_order_on_every_road():
    order = list(Rule)
    for road, rules in RULES.items():
        assert list(rules) == sorted(rules, key=order.index), road


# --- the high gate ------------------------------------------------------------------------------

@pytest.mark.parametrize("road", [Road.SINGLE, Road.TYPED, Road.EVENT])
def test_a_key_without_send_high_sends_no_high_type_or_high_priority_on_any_road(road):
    r, kind = make_recipient("h-1"), a_type("adm_high")  # made in the admin: any key may use it
    drive = {Road.SINGLE: lambda: single(no_high(), r, priority="high"),
             Road.TYPED: lambda: typed(no_high(), r, kind), Road.EVENT: lambda: event(no_high(), [r], kind)}[road]
    with pytest.raises(MissingScope) as refused:
        drive()
    assert (refused.value.field, refused.value.scope) == (
        "priority" if road == Road.SINGLE else "type", "notifications:send_high")
    assert Notification.objects.count() == 0


def test_a_campaign_of_a_type_made_high_after_it_was_accepted_sends_nothing_without_send_high():
    """The finding: a key without send_high sent an admin-made high type's content to 15 users through
    a standard campaign. The API now refuses it at creation; the fan-out road refuses it too, for a
    type made high after the campaign was accepted."""
    users = [make_recipient(f"hc-{i:02d}").user_id for i in range(15)]
    kind = a_type("adm_high", priority="standard")
    c = Campaign.objects.create(client=no_high(), segment=make_segment_of(users), channel="sms",
                                priority="standard", category="security", notification_type=kind, data={},
                                status=CampaignStatus.SCHEDULED, fanout_at=clock.now())
    NotificationType.objects.filter(pk="adm_high").update(priority="high")
    rows = run_fan_out(c)
    assert [(n.recipient_id, n.status, n.reason) for n in rows] == [
        (u, "suppressed", "high_not_allowed") for u in users]


def test_a_campaign_of_a_high_type_by_a_key_with_send_high_is_queued():
    rows = campaign(high(), [make_recipient(f"ok-{i}").user_id for i in range(3)], a_type("adm_high"))
    assert [(n.status, n.reason) for n in rows] == [("queued", "")] * 3


# --- overrides (required, quiet hours bypass) --------------------------------------------------

@pytest.mark.parametrize("change", [{"required": True}, {"quiet_hours": "bypass"},
                                    {"digest": {"window_seconds": 60, "key": ""}}],
                         ids=["required", "bypass", "digest"])
def test_a_campaign_of_a_type_changed_to_override_choices_after_it_was_accepted_sends_nothing(change):
    """The API refuses such a campaign (422 not_for_campaigns); a type changed after the campaign was
    accepted is refused at fan-out, member by member, with the same rule."""
    users = [make_recipient(f"ov-{i}", prefs={"opt_outs": ["sms"]} if i == 0 else None).user_id for i in range(3)]
    kind = a_type("notice", priority="standard", category="account")
    c = Campaign.objects.create(client=high(), segment=make_segment_of(users), channel="sms", priority="standard",
                                category="account", notification_type=kind, data={},
                                status=CampaignStatus.SCHEDULED, fanout_at=clock.now())
    NotificationType.objects.filter(pk="notice").update(**change)
    rows = run_fan_out(c)
    assert [(n.recipient_id, n.status, n.reason) for n in rows] == [
        ("ov-0", "suppressed", "opted_out_channel"),  # suppressed before the gate: its reason stands
        ("ov-1", "suppressed", "not_for_campaigns"), ("ov-2", "suppressed", "not_for_campaigns")]


@pytest.mark.parametrize(("road", "required"), [
    (Road.SINGLE, False), (Road.TYPED, False), (Road.TYPED, True), (Road.EVENT, False), (Road.EVENT, True),
    (Road.CAMPAIGN, False)])  # no type on a single send; no required type in a campaign (the overrides rule)
def test_an_opt_out_holds_on_every_road_unless_the_type_is_required(road, required):
    """Opt-outs are a send-time rule on every road (and a fan-out pre-filter); a required type skips
    them on the roads that may carry one (a campaign never may: the overrides rule)."""
    from tests.fanout_helpers import send_time_outcome

    r = make_recipient("opt-1", prefs={"opt_outs": ["sms"]})
    kind = a_type("otp", required=required)
    (n,) = {Road.SINGLE: lambda: single(high(), r), Road.TYPED: lambda: typed(high(), r, kind),
            Road.EVENT: lambda: event(high(), [r], kind),
            Road.CAMPAIGN: lambda: campaign(high(), [r.user_id], a_type("promo", priority="standard"))}[road]()
    if road == Road.CAMPAIGN:
        assert (n.status, n.reason) == ("suppressed", "opted_out_channel")
    else:
        assert send_time_outcome(n.pk) == (("ready", "") if required else ("suppressed", "opted_out_channel"))


# --- the abuse limits ---------------------------------------------------------------------------

@pytest.mark.parametrize("road", [Road.SINGLE, Road.TYPED, Road.EVENT])
def test_fifteen_users_on_one_phone_get_ten_codes_on_each_request_road(road, sharing):
    kind, client = a_type("otp"), high()
    drive = {Road.SINGLE: lambda r: single(client, r), Road.TYPED: lambda r: typed(client, r, kind),
             Road.EVENT: lambda r: event(client, [r], kind)}[road]
    refused = []
    for r in sharing:
        try:
            drive(r)
        except AcceptanceLimited as exc:
            refused.append((r.user_id, exc.limit))
    assert Notification.objects.count() == 10
    limit = "security_per_phone" if road == Road.SINGLE else "otp_per_phone"
    assert refused == [(r.user_id, limit) for r in sharing[10:]]


def test_a_campaign_of_a_limited_type_counts_each_member_and_then_events_find_the_phone_full(sharing):
    """The finding: 15 codes by campaign to one shared phone, then 10 more by events: 25 against a
    limit of 10. A campaign stored whatever made it (the API refuses one now; the admin, or a limit
    added after it was accepted) counts each member at fan-out."""
    kind = a_type("otp")
    rows = campaign(None, [r.user_id for r in sharing], kind)
    assert [(n.status, n.reason) for n in rows] == [("queued", "")] * 10 + [("suppressed", "acceptance_limited")] * 5
    client = high()
    for r in sharing:  # every member on that phone, the ten who got one included
        with pytest.raises(AcceptanceLimited) as refused:
            event(client, [r], kind)
        assert refused.value.limit == "otp_per_phone"
    assert Notification.objects.filter(status="queued").count() == 10


def test_a_fan_out_page_run_again_counts_its_members_once(sharing):
    from campaigns.fanout import fan_out_page
    from campaigns.models import CampaignShard

    kind = a_type("otp")
    rows = campaign(None, [r.user_id for r in sharing[:6]], kind)
    assert [n.status for n in rows] == ["queued"] * 6
    (c,) = Campaign.objects.all()
    CampaignShard.objects.filter(campaign=c).update(done=False, cursor=None)
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.FANNING_OUT)
    assert fan_out_page(str(c.pk), 0) == "done"  # the same members again: no new rows, no new slots
    client = high()
    for r in sharing[6:10]:  # 6 + 4 = the limit
        event(client, [r], kind)
    with pytest.raises(AcceptanceLimited):
        event(client, [sharing[10]], kind)


# --- idempotency ---------------------------------------------------------------------------------

@pytest.mark.parametrize("road", [Road.SINGLE, Road.TYPED, Road.EVENT])
def test_a_request_made_twice_is_one_notification_and_counted_once(road, sharing):
    kind, client = a_type("otp"), high()
    drive = {Road.SINGLE: lambda r, k: single(client, r, key=k), Road.TYPED: lambda r, k: typed(client, r, kind, key=k),
             Road.EVENT: lambda r, k: event(client, [r], kind, key=k)}[road]
    first = drive(sharing[0], "same-key")
    for _ in range(12):  # past the limit of 10 if a replay counted
        assert [n.pk for n in drive(sharing[0], "same-key")] == [n.pk for n in first]
    assert Notification.objects.count() == 1
    for r in sharing[1:10]:  # the phone's other nine slots are still free
        drive(r, None)
    with pytest.raises(AcceptanceLimited):
        drive(sharing[10], None)


def test_a_digest_closed_twice_makes_its_notification_once():
    r = make_recipient("dg-1")
    first = digest(high(), r)
    d = digests.Digest.objects.get(recipient=r)
    assert digests.close(d, clock.now()) == []
    assert [n.pk for n in Notification.objects.filter(digest=d)] == [n.pk for n in first]


# --- content limits ------------------------------------------------------------------------------

def test_a_single_send_over_the_sms_limit_is_refused_by_the_gate_naming_content():
    with pytest.raises(ValidationError) as refused:
        single(high(), make_recipient("c-1"), body="x" * 1601)
    assert refused.value.detail["content"][0].code == "content_limit"
    assert "1601 characters; at most 1600" in str(refused.value.detail["content"][0])
    assert Notification.objects.count() == 0


def test_a_dead_letter_whose_content_breaks_the_limits_is_not_replayed_and_says_why():
    r = make_recipient("c-2")
    bad, good = dead_letter(r, body="x" * 1601), dead_letter(r)
    assert replay_dead_letters([bad.pk, good.pk], by="staff") == 1
    assert Notification.objects.get(pk=good.pk).status == "queued"
    bad.refresh_from_db()
    assert (bad.status, bad.dead_lettered_at is not None) == ("failed", True)
    (why,) = DeliveryEvent.objects.filter(notification=bad, kind="replay_refused").values_list("detail", flat=True)
    assert why == "replay by staff refused: the rendered SMS body is 1601 characters; at most 1600 (Twilio)"


def test_a_replay_is_not_counted_against_the_limits(sharing):
    """Decided (docs/ARCHITECTURE.md §6, "Roads in"): a replay sends again what was admitted and
    counted once; staff replaying our failure do not spend the user's limit."""
    client = high()
    made = [single(client, r)[0] for r in sharing[:10]]  # the phone's window is full
    Notification.objects.filter(pk=made[0].pk).update(status=Status.FAILED, dead_lettered_at=clock.now())
    assert replay_dead_letters([made[0].pk], by="staff") == 1
    with pytest.raises(AcceptanceLimited):
        single(client, sharing[10])


# --- no other way in -----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
WRITES = re.compile(r"Notification\.objects\.(create|bulk_create|get_or_create|update_or_create)\("
                    r"|INSERT INTO notifications_notification\b|_TABLE = \"notifications_notification\""
                    r"|notification\.save\(")
#: Modules that write notification rows besides the registry's: each through one function that
#: only the road's module calls.
HELPERS = {"notifications/campaign_rows.py": ("insert_campaign_page", "campaigns/fanout.py")}


def _module_file(path: str) -> str:
    return path.rsplit(".", 1)[0].replace(".", "/") + ".py"


def _sources():
    for folder in ("core", "providers", "preferences", "notifications", "campaigns", "config"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel:
                yield rel, path.read_text()


def test_no_module_writes_notification_rows_outside_the_registered_roads():
    allowed = {_module_file(p) for p in ROADS.values()} | set(HELPERS)
    writers = {rel for rel, text in _sources() if WRITES.search(text)}
    assert writers <= allowed, f"notification rows written outside the roads: {sorted(writers - allowed)}"
    for helper, (function, caller) in HELPERS.items():
        callers = {rel for rel, text in _sources() if rel != helper and function in text}
        assert callers == {caller}, (helper, callers)


@pytest.mark.parametrize("road", [Road.SINGLE, Road.TYPED, Road.EVENT, Road.CAMPAIGN, Road.DIGEST])
def test_each_road_that_creates_rows_hands_them_to_the_webhook_outbox(road, monkeypatch):
    """A row created already final is told by :func:`outbox.emit_created`, never by a move: every road
    that inserts rows hands it what it created (fallback and replay create none: they move rows, and
    the lifecycle tells those moves)."""
    from notifications.webhooks import outbox

    handed: list[str] = []
    real = outbox.emit_created

    def spy(rows, at):
        rows = list(rows)
        handed.extend(str(r[0]) if isinstance(r, tuple) else str(r.pk) for r in rows)
        return real(rows, at)

    monkeypatch.setattr(outbox, "emit_created", spy)
    made = DRIVERS[road](make_recipient(f"told-{road}"))
    assert {str(n.pk) for n in made} <= set(handed) and made

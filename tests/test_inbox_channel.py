"""The ``in_app`` channel through the pipeline in-process (docs/APP.md): "sending" writes one inbox
item per notification (never two, however often a row is re-driven), counts move with it, quiet
hours never hold an item back unless its type says so, opt-outs and TTL apply, and a user with
devices gets one silent refresh push (data-only) per burst.

Against a real emulator subprocess (the refresh push goes through firebase-admin), Postgres and
Redis. tests/test_e2e_inbox.py runs the same with real workers."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core import clock
from core.redis_client import get_redis
from notifications import scheduler, sent_markers
from notifications.delivery import checks
from notifications.delivery.pipeline import send_notifications
from notifications.events import services
from notifications.events.models import NotificationType, QuietHoursPolicy, TypeTemplate
from notifications.inbox import store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import APIClient, DeliveryAttempt, Notification
from preferences.models import Device, Preferences, Recipient
from providers.registry import reset_backends
from tests.providers.conftest import fcm_options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def push(settings, module_emulator):
    """A push provider of its own name on the module's emulator (the refresh push's)."""
    module_emulator.reset()
    name = f"fcm{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "push": [
        {"NAME": name, "BACKEND": "providers.fcm.backend.FcmPushBackend", "OPTIONS": fcm_options(module_emulator)}]}
    reset_backends()
    yield module_emulator
    reset_backends()
    r = get_redis()
    for key in [*r.scan_iter(f"*:{name}*"), *r.scan_iter("inbox-refresh:*")]:
        r.delete(key)


def user(devices: int = 0, **over) -> Recipient:
    tag = uuid.uuid4().hex[:8]
    r = Recipient.objects.create(user_id=f"in-{tag}", **over)
    for i in range(devices):
        Device.objects.create(recipient=r, platform="android", push_token=f"tok-{tag}-{i}")
    return r


def in_app(r: Recipient, **over) -> Notification:
    fields = {"title": "Your order shipped", "body": "It arrives Friday", "data": {"order_id": "8812"},
              "category": "shipping", "status": "queued", **over}
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="in_app", **fields)


def counts(r: Recipient) -> tuple[int, int, int]:
    c = InboxCounts.objects.filter(recipient=r).first()
    return (c.unseen, c.unread, c.total) if c else (0, 0, 0)


def quiet_now(r: Recipient) -> None:
    now = clock.now().astimezone(UTC)
    Preferences.objects.update_or_create(recipient=r, defaults={
        "quiet_start": (now - timedelta(hours=1)).time().replace(microsecond=0),
        "quiet_end": (now + timedelta(hours=1)).time().replace(microsecond=0), "quiet_timezone": "UTC"})


def test_sending_writes_one_item_with_the_content_and_the_counts_and_a_silent_refresh_push(push):
    r = user(devices=2)
    n = in_app(r, expires_at=clock.now() + timedelta(days=7))

    send_notifications([str(n.pk)])

    n.refresh_from_db()
    assert (n.status, n.provider, n.reason) == ("sent", "inbox", "")
    item = InboxItem.objects.get(pk=n.pk)
    assert (item.recipient_id, item.title, item.body, item.data, item.category) == (
        r.pk, "Your order shipped", "It arrives Friday", {"order_id": "8812"}, "shipping")
    assert (item.seen_at, item.read_at, item.archived_at, item.expires_at) == (None, None, None, n.expires_at)
    assert counts(r) == (1, 1, 1)
    assert list(DeliveryAttempt.objects.filter(notification=n).values_list("provider", "outcome")) == [
        ("inbox", "accepted")]
    refreshes = push.messages(channel="push")
    assert sorted(m["to"] for m in refreshes) == sorted(r.devices.values_list("push_token", flat=True))
    for m in refreshes:
        message = m["details"]["message"]
        assert "notification" not in message  # data-only: the app refreshes, nothing is shown
        assert {k: message["data"][k] for k in ("type", "unseen", "notification_id")} == {
            "type": "inbox_refresh", "unseen": "1", "notification_id": str(n.pk)}
        assert message["apns"]["headers"]["apns-push-type"] == "background"
        assert message["android"]["collapse_key"] == "inbox_refresh"


def test_a_row_re_driven_after_its_write_is_one_item_counted_once(push):
    r = user()
    n = in_app(r)
    send_notifications([str(n.pk)])
    # A worker killed after the write, before the record: the row is claimable again, no marker.
    Notification.objects.filter(pk=n.pk).update(status="queued", reason="lease_expired")
    get_redis().delete(*[k for k in get_redis().scan_iter(f"*{n.pk}*")] or ["-"])
    assert not sent_markers.find_sent([str(n.pk)])

    send_notifications([str(n.pk)])

    assert Notification.objects.get(pk=n.pk).status == "sent"
    assert InboxItem.objects.filter(recipient=r).count() == 1
    assert counts(r) == (1, 1, 1)
    assert store.write([store.NewItem(n.pk, r.pk, "", "", "t", "b", None, clock.now(), None)]) == set()
    assert counts(r) == (1, 1, 1)


def test_a_burst_for_one_user_is_one_refresh_now_and_one_trailing_with_the_final_badge(push, monkeypatch):
    from notifications.inbox import refresh

    published = []
    monkeypatch.setattr(refresh.current_app, "send_task", lambda name, **kw: published.append((name, kw)))
    r, deviceless = user(devices=1), user()
    first = [in_app(r), in_app(deviceless)]
    send_notifications([str(n.pk) for n in first])
    for _ in range(2):
        send_notifications([str(in_app(r).pk)])

    assert counts(r) == (3, 3, 3) and counts(deviceless) == (1, 1, 1)
    assert [m["details"]["message"]["data"]["unseen"] for m in push.messages(channel="push")] == ["1"]
    ((name, kw),) = published  # one trailing refresh for the window, however many items came
    assert (name, kw["args"], kw["queue"], kw["countdown"]) == ("notifications.inbox_refresh_trailing", [[r.pk]],
                                                                "standard.in_app", 5.5)
    get_redis().delete(f"inbox-refresh:{r.pk}")  # the window is over when the task runs
    assert refresh.trailing(*kw["args"]) == 1
    newest = InboxItem.objects.filter(recipient=r).order_by("-created_at", "-notification_id").first()
    last = push.messages(channel="push")[-1]["details"]["message"]["data"]
    assert (last["unseen"], last["notification_id"]) == ("3", str(newest.pk))


def test_quiet_hours_never_hold_an_item_back_unless_its_type_says_so(push):
    r = user()
    quiet_now(r)
    kinds = {}
    for key, waits in (("inbox_now", False), ("inbox_waits", True)):
        kinds[key] = NotificationType.objects.create(key=f"{key}-{uuid.uuid4().hex[:6]}", name=key, category="social",
                                                     channels=["in_app"], in_app_quiet_hours=waits)
        TypeTemplate.objects.create(type=kinds[key], channel="in_app", locale="en", title="T",
                                    body="{{ data.who }} liked your post", data={"who": "{{ data.who }}"})
    untyped = in_app(r, category="marketing")
    client = APIClient.objects.create_key(name=f"inbox-{uuid.uuid4().hex[:6]}")[0]
    now, waits = (services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f",
                                        kind=kinds[key], recipients=[r], data={"who": "Ada"}).notifications[0]
                  for key in ("inbox_now", "inbox_waits"))
    scheduler.release_due()

    send_notifications([str(untyped.pk), str(now.pk), str(waits.pk)])

    statuses = dict(Notification.objects.filter(recipient=r).values_list("pk", "status"))
    assert (statuses[untyped.pk], statuses[now.pk], statuses[waits.pk]) == ("sent", "sent", "scheduled")
    assert Notification.objects.get(pk=waits.pk).reason == "quiet_hours"
    assert InboxItem.objects.get(pk=now.pk).body == "Ada liked your post"
    assert InboxItem.objects.get(pk=now.pk).data == {"who": "Ada"}
    assert not InboxItem.objects.filter(pk=waits.pk).exists()


def test_an_opt_out_of_in_app_or_an_expired_ttl_writes_nothing(push):
    opted = user()
    Preferences.objects.create(recipient=opted, opt_outs=["in_app"])
    category = user()
    Preferences.objects.create(recipient=category, category_opt_outs={"shipping": ["in_app"]})
    late = user()
    rows = [in_app(opted), in_app(category), in_app(late, expires_at=clock.now() - timedelta(seconds=1))]

    send_notifications([str(n.pk) for n in rows])

    got = [(n.status, n.reason) for n in Notification.objects.filter(pk__in=[n.pk for n in rows]).order_by(
        "recipient__user_id")]
    assert sorted(got) == sorted([("suppressed", "opted_out_channel"), ("suppressed", "opted_out_category"),
                                  ("expired", "ttl_expired")])
    assert InboxItem.objects.filter(pk__in=[n.pk for n in rows]).count() == 0
    assert push.count(channel="push") == 0


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(typed=st.booleans(), waits=st.booleans(), policy=st.sampled_from(list(QuietHoursPolicy.values)),
       quiet=st.booleans(), priority=st.sampled_from(["high", "standard"]),
       category=st.sampled_from(["marketing", "security", "social", ""]))
def test_the_quiet_hours_rule_for_in_app_over_generated_inputs(typed, waits, policy, quiet, priority, category):
    """Deferred exactly when the row is typed, its type sets in_app_quiet_hours, its policy is not
    bypass, and now is inside the user's quiet window; otherwise written now."""
    r = user()
    if quiet:
        quiet_now(r)
    kind = NotificationType(key="k", name="k", category=category or "social", channels=["in_app"],
                            quiet_hours=policy, in_app_quiet_hours=waits) if typed else None
    n = Notification(id=uuid.uuid4(), recipient=Recipient.objects.get(pk=r.pk), channel="in_app",
                     priority=priority, category=category, body="b")
    found = checks.verdict(n, checks.Facts(kind=kind), clock.now())
    deferred = typed and waits and policy != QuietHoursPolicy.BYPASS and quiet
    assert (found is not None and found.reason == "quiet_hours") == deferred
    assert found is None or found.reason == "quiet_hours"


def test_a_row_whose_worker_died_after_the_write_is_never_cancelled_and_its_re_drive_finds_the_item(push):
    from notifications import services
    from tests.fanout_helpers import make_campaign

    r = user()
    campaign_id = make_campaign([r.pk], channel="in_app", category="news", status="sending").pk
    single, of_campaign = in_app(r), in_app(r, campaign_id=campaign_id, category="news")
    send_notifications([str(single.pk), str(of_campaign.pk)])
    # Their worker killed between the write and the record: the reconciler's re-drive state, no marker.
    Notification.objects.filter(pk__in=[single.pk, of_campaign.pk]).update(status="scheduled", reason="lease_expired")
    get_redis().delete(*[k for k in get_redis().scan_iter("*sent*")] or ["-"])

    with pytest.raises(services.NotCancellable):
        services.cancel_notification(single.pk)
    assert services.cancel_campaign_notifications(campaign_id) == 0
    Notification.objects.filter(pk__in=[single.pk, of_campaign.pk]).update(status="queued")
    send_notifications([str(single.pk), str(of_campaign.pk)])

    for n in (single, of_campaign):
        n.refresh_from_db()
        assert (n.status, n.provider) == ("sent", "inbox")
        assert list(n.attempts_log.values_list("outcome", flat=True)) == ["accepted", "found_by_lookup"]
    assert InboxItem.objects.filter(recipient=r).count() == 2 and counts(r) == (2, 2, 2)

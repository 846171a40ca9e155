"""Typed notifications through the pipeline in-process (docs/TYPES.md): content rendered at send
time from the type's template (locale, event data, escaping; a fix after acceptance applies), the
type's quiet-hours policy (defer, bypass, silent push), required categories and type opt-outs,
fallback routing as each channel ends, and a template that fails at send time.

Against a real emulator subprocess, Postgres and Redis (committed rows: the pipeline's own
connections see them). tests/test_e2e_events.py runs the same with real workers."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest

from core import clock
from core.redis_client import get_redis
from notifications import scheduler
from notifications.delivery import load
from notifications.delivery.claim import claim
from notifications.delivery.content import Content
from notifications.delivery.pipeline import prepare, send_notifications
from notifications.events import services
from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import APIClient, Notification
from preferences.models import Device, Preferences, Recipient, SmsStop
from providers.registry import reset_backends
from tests.providers.conftest import fcm_options, sendgrid_options, twilio_options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def providers(settings, module_emulator):
    """SMS, email and push providers of their own names on the module's emulator."""
    module_emulator.reset()
    tag = uuid.uuid4().hex[:6]
    names = {"sms": f"tw{tag}", "email": f"sg{tag}", "push": f"fcm{tag}"}
    settings.PROVIDERS = {
        "sms": [{"NAME": names["sms"], "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
                 "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}],
        "email": [{"NAME": names["email"], "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
                   "OPTIONS": sendgrid_options(module_emulator)}],
        "push": [{"NAME": names["push"], "BACKEND": "providers.fcm.backend.FcmPushBackend",
                  "OPTIONS": fcm_options(module_emulator)}],
    }
    reset_backends()
    yield names
    reset_backends()
    r = get_redis()
    for name in names.values():
        keys = list(r.scan_iter(f"*:{name}*"))
        if keys:
            r.delete(*keys)


@pytest.fixture
def client():
    return APIClient.objects.create_key(name=f"typed-{uuid.uuid4().hex[:6]}")[0]


def a_type(key: str, channels=("push", "email"), **over) -> NotificationType:
    kind = NotificationType.objects.create(key=key, name=key, category=over.pop("category", "shipping"),
                                           channels=list(channels), **over)
    for channel in channels:
        TypeTemplate.objects.create(type=kind, channel=channel, locale="en", title="Order {{ data.order_id }}",
                                    body="Hi {{ first_name }}, order {{ data.order_id }} shipped",
                                    html="<p>{{ first_name }}</p>" if channel == "email" else "")
    return kind


def user(**over) -> Recipient:
    tag = uuid.uuid4().hex[:8]
    fields = {"user_id": f"t-{tag}", "email": f"{tag}@example.org", "phone": "+15550001234",
              "attributes": {"first_name": "<Ada>"}, **over}
    devices = fields.pop("devices", 1)
    r = Recipient.objects.create(**fields)
    for i in range(devices):
        Device.objects.create(recipient=r, platform="android", push_token=f"tok-{tag}-{i}")
    return r


def quiet_now(r: Recipient) -> None:
    """Quiet hours around now (UTC), for ``r``."""
    now = clock.now().astimezone(UTC)
    Preferences.objects.update_or_create(recipient=r, defaults={
        "quiet_start": (now - timedelta(hours=1)).time().replace(microsecond=0),
        "quiet_end": (now + timedelta(hours=1)).time().replace(microsecond=0), "quiet_timezone": "UTC"})


def event(client, kind, recipients, data=None, **kw) -> dict[tuple[str, str], Notification]:
    accepted = services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                                     recipients=recipients, data=data or {"order_id": "8812"}, **kw)
    scheduler.release_due()  # what beat does within a second: standard rows due now are released in batches
    return {(n.recipient_id, n.channel): n.pk for n in accepted.notifications}


def row(pk) -> Notification:
    return Notification.objects.get(pk=pk)


def test_content_is_rendered_at_send_time_in_the_locale_and_a_later_fix_applies(providers, module_emulator, client):
    kind = a_type("shipped", channels=("email",))
    TypeTemplate.objects.create(type=kind, channel="email", locale="de", title="Bestellung {{ data.order_id }}",
                                body="Hallo {{ first_name }}", html="<p>Hallo {{ first_name }}</p>")
    german, english = user(locale="de-AT"), user(locale="fr")
    ids = event(client, kind, [german, english])
    TypeTemplate.objects.filter(type=kind, locale="en").update(body="Fixed: {{ data.order_id }}")

    send_notifications([ids[(german.pk, "email")], ids[(english.pk, "email")]])

    by_to = {m["to"]: m for m in module_emulator.messages()}
    assert (by_to[german.email]["title"], by_to[german.email]["body"]) == ("Bestellung 8812", "Hallo <Ada>")
    assert (by_to[english.email]["title"], by_to[english.email]["body"]) == ("Order 8812", "Fixed: 8812")
    assert row(ids[(german.pk, "email")]).status == "sent"


def test_quiet_hours_follow_the_type_defer_bypass_or_silent(providers, module_emulator, client):
    r = user()
    quiet_now(r)
    deferred = event(client, a_type("digest_ready", quiet_hours="defer"), [r])
    bypassed = event(client, a_type("fraud_alert", quiet_hours="bypass", category="security"), [r])
    silent = event(client, a_type("order_update", quiet_hours="silent"), [r])

    send_notifications([*deferred.values(), *bypassed.values(), *silent.values()])

    assert [row(deferred[(r.pk, c)]).status for c in ("push", "email")] == ["scheduled", "scheduled"]
    assert row(deferred[(r.pk, "email")]).reason == "quiet_hours"
    assert [row(bypassed[(r.pk, c)]).status for c in ("push", "email")] == ["sent", "sent"]
    push, email = row(silent[(r.pk, "push")]), row(silent[(r.pk, "email")])
    assert (push.status, email.status, email.reason) == ("sent", "scheduled", "quiet_hours")
    assert list(push.events.filter(kind="silent").values_list("status", flat=True)) == ["sending"]
    assert "silent (data-only) push" in push.events.get(kind="silent").detail
    assert email.due_at > clock.now() + timedelta(minutes=55)
    assert module_emulator.count(channel="push") == 2 and module_emulator.count(channel="email") == 1


def test_a_required_type_ignores_opt_outs_and_a_type_opt_out_suppresses_only_that_type(providers, client):
    r = user()
    Preferences.objects.create(recipient=r, opt_outs=["email"], category_opt_outs={"security": ["push"]},
                               type_opt_outs={"new_follower": ["push"]})
    required = event(client, a_type("password_changed", category="security", required=True), [r])
    follower = event(client, a_type("new_follower", category="social"), [r])
    other = event(client, a_type("new_like", category="social"), [r])

    send_notifications([*required.values(), *follower.values(), *other.values()])

    assert [(row(required[(r.pk, c)]).status) for c in ("push", "email")] == ["sent", "sent"]
    assert [(row(follower[(r.pk, c)]).status, row(follower[(r.pk, c)]).reason) for c in ("push", "email")] == [
        ("suppressed", "opted_out_type"), ("suppressed", "opted_out_channel")]
    assert "new_follower on push" in row(follower[(r.pk, "push")]).reason_detail
    assert row(other[(r.pk, "push")]).status == "sent"


def test_fallback_tries_the_next_channel_only_when_the_one_before_cannot_reach_the_user(providers, module_emulator,
                                                                                       client):
    kind = a_type("otp_fallback", channels=("push", "email", "sms"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    no_device = user(devices=0)
    ids = event(client, kind, [no_device])
    push, email, sms = (ids[(no_device.pk, c)] for c in ("push", "email", "sms"))

    send_notifications([push])
    assert (row(push).status, row(push).reason) == ("suppressed", "no_active_device")
    assert (row(email).status, row(email).reason, row(sms).status) == ("queued", "", "scheduled")
    assert list(row(email).events.values_list("kind", flat=True)) == ["accepted", "released"]

    send_notifications([email])
    assert row(email).status == "sent"
    assert (row(sms).status, row(sms).reason) == ("suppressed", "fallback_not_needed")
    assert row(sms).reason_detail == "an earlier channel in the fallback order (email: sent) reached the recipient"
    assert module_emulator.count(channel="sms") == 0 and module_emulator.count(channel="email") == 1


def test_fallback_with_every_channel_ineligible_leaves_one_suppressed_row_per_channel(providers, client):
    kind = a_type("reach_me", channels=("push", "email", "sms"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    nobody = user(devices=0, email="", phone="")
    ids = event(client, kind, [nobody])
    for channel in ("push", "email", "sms"):
        send_notifications([ids[(nobody.pk, channel)]])
    assert [(row(ids[(nobody.pk, c)]).status, row(ids[(nobody.pk, c)]).reason) for c in ("push", "email", "sms")] == [
        ("suppressed", "no_active_device"), ("suppressed", "no_email"), ("suppressed", "no_phone")]


def test_the_reconciler_settles_a_fallback_left_waiting_behind_a_row_that_ended(providers, client):
    kind = a_type("crashy", channels=("push", "email"), routing="fallback")
    r = user()
    ids = event(client, kind, [r])
    # The push ended by a path that does not settle fallbacks (e.g. written before a crash).
    Notification.objects.filter(pk=ids[(r.pk, "push")]).update(status="failed", reason="permanent_error")
    assert scheduler.reconcile()["fallbacks"] == 1
    assert row(ids[(r.pk, "email")]).status == "queued"
    assert scheduler.reconcile()["fallbacks"] == 0


def test_a_template_that_fails_at_send_time_is_a_dead_letter_with_its_error(providers, client):
    kind = a_type("broken", channels=("email",))
    TypeTemplate.objects.filter(type=kind).update(body="{{ data.n / 0 }}")
    r = user()
    ids = event(client, kind, [r], data={"n": 1})
    send_notifications(list(ids.values()))
    n = row(ids[(r.pk, "email")])
    assert (n.status, n.reason) == ("failed", "template_error") and n.dead_lettered_at is not None
    assert n.reason_detail == "template error: ZeroDivisionError: division by zero"


def test_a_type_with_its_own_sms_sender_honours_the_stop_list_of_that_sender(providers, module_emulator, client):
    kind = a_type("shop_sms", channels=("sms",), sms_from="+15005550006")
    TypeTemplate.objects.filter(type=kind).update(title="")
    stopped, fine = user(phone="+15550009999"), user(phone="+15550008888")
    SmsStop.objects.create(phone="+15550009999", sender="+15005550006", source="twilio 21610")
    ids = event(client, kind, [stopped, fine])
    send_notifications(list(ids.values()))
    assert (row(ids[(stopped.pk, "sms")]).status, row(ids[(stopped.pk, "sms")]).reason) == ("suppressed",
                                                                                           "sms_stopped")
    assert "+15005550006" in row(ids[(stopped.pk, "sms")]).reason_detail
    assert [m["to"] for m in module_emulator.messages()] == ["+15550008888"]


def test_a_campaign_can_use_a_types_templates_with_its_own_data(providers, module_emulator, client):
    from campaigns.models import Campaign, Segment

    kind = a_type("weekly_picks", channels=("push",), collapse_key="picks-{{ data.week }}")
    TypeTemplate.objects.filter(type=kind).update(body="Week {{ data.week }} for {{ first_name }}",
                                                  data={"screen": "picks/{{ data.week }}"})
    segment = Segment.objects.create(segment_id=f"s-{uuid.uuid4().hex[:6]}", name="s")
    campaign = Campaign.objects.create(segment=segment, channel="push", notification_type=kind, data={"week": "49"},
                                       status="sending")
    r = user()
    n = Notification.objects.create(id=uuid.uuid4(), campaign_id=campaign.pk, recipient=r, channel="push",
                                    category="marketing", body="", status="queued")

    send_notifications([str(n.pk)])

    assert row(n.pk).status == "sent"
    (message,) = module_emulator.messages()
    # The type's title reads {{ data.order_id }}, which this campaign's data lacks: it renders empty.
    assert (message["title"], message["body"]) == ("Order ", "Week 49 for <Ada>")
    # Its send options come back from the campaigns' content source: the type's collapse key.
    assert message["details"]["message"]["android"]["collapse_key"] == "picks-49"


def test_a_sent_typed_notification_keeps_what_it_said(providers, module_emulator, client):
    kind = a_type("kept", channels=("push", "email"))
    TypeTemplate.objects.filter(type=kind, channel="push").update(data={"url": "https://x/{{ data.order_id }}"})
    r = user()
    ids = event(client, kind, [r])
    send_notifications(list(ids.values()))
    push, email = row(ids[(r.pk, "push")]), row(ids[(r.pk, "email")])
    assert (push.title, push.body, push.data) == ("Order 8812", "Hi <Ada>, order 8812 shipped",
                                                  {"url": "https://x/8812"})
    assert (email.title, email.html, email.data) == ("Order 8812", "<p>&lt;Ada&gt;</p>", None)


@pytest.mark.parametrize(("channel", "part", "value", "problem"), [
    ("push", "title", "w" * 999, "the rendered title is 999 characters; at most 998"),
    ("email", "title", "Hi\r\nBcc: evil@example.com",
     "the rendered email subject has a line break; a subject is one line"),
    ("sms", "body", "x" * 1601, "the rendered SMS body is 1601 characters; at most 1600 (Twilio)"),
    ("sms", "body", "   ", "the rendered body is empty"),
    ("push", "body", "y" * 5000, "the rendered push (title + body + data as JSON) is 5023 bytes; at most 4096 (FCM)"),
])
def test_rendered_content_over_a_channels_limit_is_a_dead_letter_and_the_batch_goes_on(
        providers, module_emulator, client, channel, part, value, problem):
    """Adversarial finding (issue 14): a 999-character rendered title failed the whole batch's
    record (the column holds 998), so every row of it was sent and left `sending`; a subject with a
    line break from the data went out (or was retried as transient by SMTP)."""
    kind = a_type(f"limits_{channel}_{part}_{len(value)}", channels=(channel,))
    TypeTemplate.objects.filter(type=kind).update(**{"title": "T", "html": "", part: "{{ data.v }}"})
    bad, good = user(), user()
    ids = event(client, kind, [bad], data={"v": value})
    fine = event(client, kind, [good], data={"v": "fine"})
    send_notifications([*ids.values(), *fine.values()])
    n = row(ids[(bad.pk, channel)])
    assert (n.status, n.reason, n.reason_detail) == ("failed", "template_error", problem)
    assert row(fine[(good.pk, channel)]).status == "sent"
    assert module_emulator.count() == 1


def test_a_rendered_collapse_key_with_a_control_character_goes_out_hashed(providers, module_emulator, client):
    kind = a_type("ck_ctrl", channels=("push",), collapse_key="{{ data.ck }}")
    r = user()
    ids = event(client, kind, [r], data={"ck": "a\nb", "order_id": "1"})
    send_notifications(list(ids.values()))
    (message,) = module_emulator.messages()
    key = message["details"]["message"]["android"]["collapse_key"]
    assert key.startswith("ck-") and len(key) == 43 and "\n" not in key


def test_the_sweep_finds_an_ended_row_behind_many_waiting_ones(providers, client):
    """Adversarial finding (issue 14): the sweep read the first 1,000 waiting rows whatever their
    predecessor, so with more waiting than that, rows behind a dead letter could wait forever."""
    kind = a_type("many_waiting", channels=("push", "email"), routing="fallback")
    crowd = [user() for _ in range(30)]
    event(client, kind, crowd, scheduled_at=clock.now() + timedelta(days=1))  # 30 rows waiting, none ended
    r = user()
    ids = event(client, kind, [r])
    Notification.objects.filter(pk=ids[(r.pk, "push")]).update(status="failed", reason="worker_lost")
    from notifications.events import fallback

    assert fallback.sweep(limit=5) == 1
    assert row(ids[(r.pk, "email")]).status == "queued"


def test_a_dead_lettered_row_of_a_lost_worker_releases_the_next_channel_at_once(providers, client, settings):
    kind = a_type("lost_worker", channels=("push", "email"), routing="fallback")
    r = user()
    ids = event(client, kind, [r])
    push = ids[(r.pk, "push")]
    Notification.objects.filter(pk=push).update(status="sending", attempts=settings.NOTIFY["MAX_ATTEMPTS"]["standard"],
                                                lease_until=clock.now() - timedelta(seconds=1))
    from notifications.scheduler import _expired_leases

    assert _expired_leases(clock.now(), 100) == 1
    assert (row(push).status, row(push).reason) == ("failed", "worker_lost")
    assert row(ids[(r.pk, "email")]).status == "queued"


def test_a_not_needed_chain_names_the_channel_that_reached_the_user(providers, module_emulator, client):
    kind = a_type("three_step", channels=("push", "email", "sms"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    r = user()
    ids = event(client, kind, [r])
    send_notifications([ids[(r.pk, "push")]])
    expected = "an earlier channel in the fallback order (push: sent) reached the recipient"
    assert [row(ids[(r.pk, c)]).reason_detail for c in ("email", "sms")] == [expected, expected]


def test_a_type_made_sensitive_after_acceptance_hides_what_its_rows_rendered(providers, client):
    """Adversarial finding (issue 14): a row accepted before its type became sensitive stored the
    rendered one-time code visibly."""
    kind = a_type("became_secret", channels=("email",))
    r = user()
    ids = event(client, kind, [r])
    NotificationType.objects.filter(pk=kind.pk).update(sensitive=True)
    send_notifications(list(ids.values()))
    n = row(ids[(r.pk, "email")])
    assert (n.status, n.sensitive) == ("sent", True)


def test_a_sensitive_rows_template_error_does_not_quote_its_data(providers, client):
    """Adversarial finding (issue 14): "'dict object' has no attribute '318318'" put the one-time
    code of a sensitive type into the reason detail support and the API read."""
    kind = a_type("secret_err", channels=("email",), sensitive=True)
    TypeTemplate.objects.filter(type=kind).update(body="{{ data.labels[data.code].name }}")
    r = user()
    ids = event(client, kind, [r], data={"code": "318318", "labels": {}})
    send_notifications(list(ids.values()))
    n = row(ids[(r.pk, "email")])
    assert (n.status, n.reason) == ("failed", "template_error")
    assert "318318" not in n.reason_detail and "sensitive" in n.reason_detail
    assert not n.events.filter(detail__contains="318318").exists()


def bounce(n: Notification):
    from notifications import receipts
    return receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:{uuid.uuid4().hex}", kind=receipts.FAILED,
                            raw="bounce", notification_id=str(n.pk), provider_message_id=n.provider_message_id,
                            error_code="5.1.1", detail="550 5.1.1 no such user")


def test_a_bounce_after_sent_reopens_the_fallback_and_the_next_channel_goes(providers, module_emulator, client):
    from notifications import receipts
    kind = a_type("reach_by_mail", channels=("email", "sms", "push"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    r = user()
    ids = event(client, kind, [r])
    email, sms, push = (ids[(r.pk, c)] for c in ("email", "sms", "push"))
    send_notifications([email])
    assert [(row(p).status, row(p).reason) for p in (email, sms, push)] == [
        ("sent", ""), ("suppressed", "fallback_not_needed"), ("suppressed", "fallback_not_needed")]

    receipts.apply_receipts([bounce(row(email))])

    assert (row(email).status, row(email).reason) == ("failed", "provider_bounced")
    assert (row(sms).status, row(sms).reason) == ("queued", "")
    assert (row(push).status, row(push).reason) == ("scheduled", "fallback_waiting")
    assert list(row(sms).events.values_list("kind", "detail").order_by("created_at", "id"))[-1] == (
        "released", "released: the channel before it in the fallback order (email: provider_bounced) was sent but "
                    "did not reach the recipient")
    send_notifications([sms])
    assert row(sms).status == "sent"
    assert (row(push).status, row(push).reason) == ("suppressed", "fallback_not_needed")
    assert module_emulator.count(channel="sms") == 1 and module_emulator.count(channel="push") == 0
    # The same bounce again (a provider's retry of its webhook) changes nothing.
    receipts.apply_receipts([bounce(row(email))])
    assert (row(sms).status, row(push).status) == ("sent", "suppressed")


def test_a_bounce_does_not_reopen_a_channel_whose_ttl_ran_out_or_that_was_not_left_by_the_send(providers, client):
    from notifications import receipts
    kind = a_type("late_bounce", channels=("email", "sms"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    expired_user, cancelled_user = user(), user()
    ids = event(client, kind, [expired_user, cancelled_user])
    send_notifications([ids[(expired_user.pk, "email")], ids[(cancelled_user.pk, "email")]])
    Notification.objects.filter(pk=ids[(expired_user.pk, "sms")]).update(expires_at=clock.now() - timedelta(seconds=1))
    Notification.objects.filter(pk=ids[(cancelled_user.pk, "sms")]).update(status="cancelled",
                                                                           reason="cancelled_by_client")

    receipts.apply_receipts([bounce(row(ids[(u.pk, "email")])) for u in (expired_user, cancelled_user)])

    assert (row(ids[(expired_user.pk, "sms")]).status, row(ids[(expired_user.pk, "sms")]).reason) == (
        "suppressed", "fallback_not_needed")
    assert row(ids[(cancelled_user.pk, "sms")]).status == "cancelled"
    assert [row(ids[(u.pk, "email")]).status for u in (expired_user, cancelled_user)] == ["failed", "failed"]


def test_cancelling_a_sent_fallback_event_stops_a_later_bounce_from_reopening_it(providers, module_emulator, client):
    from notifications import receipts
    kind = a_type("cancel_then_bounce", channels=("email", "sms"), routing="fallback")
    TypeTemplate.objects.filter(type=kind, channel="sms").update(title="")
    r = user()
    ids = event(client, kind, [r])
    email, sms = ids[(r.pk, "email")], ids[(r.pk, "sms")]
    send_notifications([email])
    assert (row(sms).status, row(sms).reason) == ("suppressed", "fallback_not_needed")

    assert services.cancel_event(row(email).event) == 1  # the channel a bounce could reopen

    receipts.apply_receipts([bounce(row(email))])
    assert (row(email).status, row(sms).status, row(sms).reason) == ("failed", "cancelled", "cancelled_by_client")
    assert module_emulator.count(channel="sms") == 0


def test_the_stages_hand_on_what_they_learn_in_a_row_and_leave_the_orm_row_its_columns(client):
    """The checks verdict (silent push) and the type's send options (collapse key) travel in the
    :class:`~notifications.delivery.types.Row` that ``prepare`` returns, and reach the message from
    there; no stage writes an attribute of its own on the Notification."""
    r = user(devices=2)
    quiet_now(r)
    kind = a_type("order_update", channels=("push",), quiet_hours="silent", collapse_key="order-{{ data.order_id }}")
    pk = event(client, kind, [r])[(r.pk, "push")]
    assert claim([str(pk)], clock.now()) == [pk]
    n = load.rows([pk])[0]

    ready = prepare(n, set(), Content())

    assert set(vars(n)) - {f.attname for f in Notification._meta.concrete_fields} == {"_state"}
    assert ready is not None
    assert (ready.n, ready.silent, ready.options.collapse_key, [d.push_token for d in ready.devices]) == (
        n, True, "order-8812", [d.push_token for d in r.devices.order_by("id")])
    message = load.message_for(ready, ready.devices[0].push_token, "android")
    assert (message.silent, message.collapse_key, message.title) == (True, "order-8812", "Order 8812")

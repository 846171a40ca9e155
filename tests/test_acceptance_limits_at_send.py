"""Abuse limits at send time (docs/POLICIES.md, "Abuse limits", "At send time"), in-process with a
real emulator: a row whose phone or address changed after acceptance is counted again against the
contact it now goes to, and suppressed ``acceptance_limited`` over the limit; a row whose contact is
the one counted costs no Redis call and is never counted twice."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from core import clock
from notifications import admission
from notifications.acceptance.models import AcceptanceLimit
from notifications.delivery.pipeline import send_notifications
from notifications.lifecycle.send import release_due
from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Recipient
from providers.registry import reset_backends
from tests.conftest import EVERY_SCOPE
from tests.providers.conftest import sendgrid_options, twilio_options
from tests.test_acceptance_limits import otp_type

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
VICTIM = "+4915112349999"


@pytest.fixture
def providers(settings, module_emulator):
    """SMS and email providers of their own names on the emulator."""
    module_emulator.reset()
    tag = uuid.uuid4().hex[:6]
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "sms": [{"NAME": f"tw{tag}", "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
                 "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}],
        "email": [{"NAME": f"sg{tag}", "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
                   "OPTIONS": sendgrid_options(module_emulator)}],
    }
    reset_backends()
    yield module_emulator
    reset_backends()


@pytest.fixture
def http(frozen):
    _, key = APIClient.objects.create_key(name=f"limits-{uuid.uuid4().hex[:6]}", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


def post_event(http, user_id: str, key: str, **extra):
    body = {"type": "otp", "user_id": user_id, "data": {"code": "123456"}, **extra}
    return http.post("/v1/events", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": key})


def send_due() -> None:
    """What the scheduler and the workers do, in-process: release the due rows, send the queued."""
    release_due(clock.now(), 1000)
    send_notifications([str(pk) for pk in Notification.objects.filter(status="queued").values_list("pk", flat=True)])


def sent_to(emulator, to: str) -> int:
    return sum(1 for m in emulator.messages() if m.get("to") == to)


def test_phones_set_after_acceptance_are_counted_at_send_and_the_limit_holds(http, frozen, providers):
    otp_type()
    for i in range(11):
        Recipient.objects.create(user_id=f"sp{i:02d}", phone=VICTIM)
    for i in range(10):
        assert post_event(http, f"sp{i:02d}", f"k{i}").status_code == 202
    refused = post_event(http, "sp10", "k10")
    assert (refused.status_code, refused.json()["error"]["limit"]) == (429, "otp_per_phone")
    scheduled = (NOW + timedelta(seconds=15)).isoformat()
    for user_id in ("sp20", "sp21", "sp22"):
        Recipient.objects.create(user_id=user_id)  # no phone: not counted per phone at acceptance
        assert post_event(http, user_id, f"k-{user_id}", scheduled_at=scheduled).status_code == 202
        resp = http.put(f"/v1/users/{user_id}", data=json.dumps({"phone": VICTIM}), content_type="application/json")
        assert resp.status_code == 200, resp.content
    send_due()
    frozen[0] = NOW + timedelta(seconds=15)
    send_due()
    assert sent_to(providers, VICTIM) == 10
    late = Notification.objects.filter(recipient_id__in=["sp20", "sp21", "sp22"])
    assert sorted(late.values_list("recipient_id", "status", "reason")) == [
        (u, "suppressed", "acceptance_limited") for u in ("sp20", "sp21", "sp22")]
    assert set(late.values_list("reason_detail", flat=True)) == {
        *(f"user '{u}' is over the limit otp_per_phone (at most 10 of type otp per phone in 600 s); a slot frees "
          "in 585 s" for u in ("sp20", "sp21", "sp22"))}
    assert sorted(DeliveryEvent.objects.filter(notification__in=late, kind="suppressed")
                  .values_list("reason", flat=True)) == ["acceptance_limited"] * 3
    # Once the first ten leave the window the number takes codes again, counted from then.
    frozen[0] = NOW + timedelta(seconds=601)
    Recipient.objects.create(user_id="sp30")
    assert post_event(http, "sp30", "k-sp30").status_code == 202
    Recipient.objects.filter(pk="sp30").update(phone=VICTIM)
    send_due()
    assert sent_to(providers, VICTIM) == 11


def test_a_phone_changed_to_another_full_number_is_counted_there(http, frozen, providers):
    otp_type()
    Recipient.objects.create(user_id="mover", phone="+4915100000001")
    assert post_event(http, "mover", "k-mover", scheduled_at=(NOW + timedelta(seconds=30)).isoformat()).status_code \
        == 202
    for i in range(10):
        Recipient.objects.create(user_id=f"h{i}", phone=VICTIM)
        assert post_event(http, f"h{i}", f"k{i}").status_code == 202
    Recipient.objects.filter(pk="mover").update(phone=VICTIM)
    frozen[0] = NOW + timedelta(seconds=30)
    send_due()
    assert (sent_to(providers, VICTIM), sent_to(providers, "+4915100000001")) == (10, 0)
    assert Notification.objects.get(recipient_id="mover").reason == "acceptance_limited"


def test_an_address_changed_after_acceptance_is_counted_per_email(http, frozen, providers):
    otp_type(channels=("email",))
    AcceptanceLimit.objects.create(name="otp_per_email", type_key="otp", per="email", limit=2, window_seconds=600)
    for i in range(2):
        Recipient.objects.create(user_id=f"e{i}", email="Victim@Example.org")
        assert post_event(http, f"e{i}", f"k{i}").status_code == 202
    Recipient.objects.create(user_id="e2", email="other@example.org")
    assert post_event(http, "e2", "k2").status_code == 202
    Recipient.objects.filter(pk="e2").update(email="victim@example.org")  # the same address, other case
    send_due()
    assert sorted(Notification.objects.values_list("recipient_id", "status", "reason")) == [
        ("e0", "sent", ""), ("e1", "sent", ""), ("e2", "suppressed", "acceptance_limited")]
    assert len(providers.messages()) == 2


def test_a_contact_that_was_counted_costs_no_query_or_redis_call_and_counts_once(http, frozen, providers,
                                                                                  monkeypatch):
    otp_type()
    for i in range(10):
        Recipient.objects.create(user_id=f"c{i}", phone=VICTIM)
        assert post_event(http, f"c{i}", f"k{i}").status_code == 202

    def never(*args, **kwargs):
        raise AssertionError("a row whose contact was counted at acceptance is not counted again")

    monkeypatch.setattr(admission, "reserve", never)
    monkeypatch.setattr(admission, "effective_rules", never)
    send_due()
    assert sent_to(providers, VICTIM) == 10
    assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


def test_a_row_counted_at_acceptance_and_checked_again_is_not_counted_twice(http, frozen, providers):
    """A row without the mark (made before it existed, or a campaign's) is checked at send with the
    member it took at acceptance: a window that holds it does not count it again."""
    otp_type()
    for i in range(10):
        Recipient.objects.create(user_id=f"m{i}", phone=VICTIM)
        assert post_event(http, f"m{i}", f"k{i}").status_code == 202
    Notification.objects.update(limit_contact="")
    send_due()
    assert sent_to(providers, VICTIM) == 10
    assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


def test_a_campaign_member_whose_phone_changed_after_fan_out_is_counted_at_send():
    from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out, send_time_outcome

    AcceptanceLimit.objects.create(name="alerts_per_phone", category="alerts", per="phone", limit=2,
                                   window_seconds=600)
    for user_id in ("ca", "cb"):
        make_recipient(user_id, phone=VICTIM)
    make_recipient("cc", phone="+4915100000002")  # counted on its own number at fan-out
    rows = run_fan_out(make_campaign(["ca", "cb", "cc"], channel="sms", category="alerts"))
    assert [(n.recipient_id, n.status) for n in rows] == [("ca", "queued"), ("cb", "queued"), ("cc", "queued")]
    Recipient.objects.filter(pk="cc").update(phone=VICTIM)
    # ca and cb were counted at fan-out (member {campaign}:{user}): not again; cc now is, over the limit.
    assert [send_time_outcome(n.pk) for n in rows] == [
        ("ready", ""), ("ready", ""), ("suppressed", "acceptance_limited")]


def test_a_digest_is_counted_as_its_first_event_and_again_for_a_changed_phone(frozen, providers):
    from notifications.events import digests, services
    from notifications.events.models import NotificationType, TypeTemplate

    kind = NotificationType.objects.create(key="alerts", name="Alerts", category="security", channels=["sms"],
                                           digest={"window_seconds": 60, "key": ""})
    TypeTemplate.objects.create(type=kind, channel="sms", locale="en", body="{{ count }} alerts")
    AcceptanceLimit.objects.create(name="alerts_per_phone", type_key="alerts", per="phone", limit=2,
                                   window_seconds=600)
    client = APIClient.objects.create_key(name="digests")[0]
    owner = Recipient.objects.create(user_id="da", phone=VICTIM)
    mover = Recipient.objects.create(user_id="db", phone="+4915100000003")
    for recipient in (owner, owner, mover):
        services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                              recipients=[recipient], data={})
    Recipient.objects.filter(pk="db").update(phone=VICTIM)
    frozen[0] = NOW + timedelta(seconds=61)
    assert digests.close_due() == 2
    send_due()
    # da's two events took VICTIM's two slots; its digest is its first event's (not counted again);
    # db's was counted on another number, and is over the limit on VICTIM's.
    assert sorted(Notification.objects.values_list("recipient_id", "status", "reason")) == [
        ("da", "sent", ""), ("db", "suppressed", "acceptance_limited")]
    assert sent_to(providers, VICTIM) == 1


def test_a_row_to_recount_waits_for_a_retry_while_the_windows_are_unreachable(http, frozen, providers, monkeypatch):
    import redis

    from notifications.acceptance import rules

    otp_type()
    Recipient.objects.create(user_id="rd")
    assert post_event(http, "rd", "k-rd").status_code == 202
    Recipient.objects.filter(pk="rd").update(phone=VICTIM)

    def unreachable(_source):
        def run(**_kwargs):
            raise redis.ConnectionError("connection refused")
        return run

    monkeypatch.setattr(rules, "script", unreachable)
    send_due()
    n = Notification.objects.get()
    assert (n.status, n.reason, len(providers.messages())) == ("scheduled", "worker_error", 0)
    assert "AcceptanceLimitsUnavailable" in n.reason_detail

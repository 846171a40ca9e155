"""Delivery-receipt webhooks: signatures checked with the SDKs' own helpers, receipts applied once and
monotonically, contact hygiene. In-process (Django test client) against the real database."""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.test import Client
from django.utils import timezone
from twilio.request_validator import RequestValidator

from notifications.models import DeliveryEvent, Notification
from preferences.models import Preferences, Recipient, SmsStop

pytestmark = pytest.mark.django_db

PUBLIC = "https://notify.example.com"
TWILIO_TOKEN = "emulator-auth-token"
SENDER = "+15005550006"


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.PUBLIC_BASE_URL = PUBLIC


@pytest.fixture
def sg_key(settings):
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    settings.SENDGRID_WEBHOOK_PUBLIC_KEY = base64.b64encode(der).decode()
    return key


def make_notification(channel: str, status: str = "sent", category: str = "") -> Notification:
    uid = f"w-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel=channel, body="b", status=status,
                                       category=category, provider_message_id=f"SM{uuid.uuid4().hex}")


# --- Twilio --------------------------------------------------------------------------------------

def twilio_post(n: Notification, status: str, *, code: str = "", sign_url: str | None = None,
                signature: str | None = None, tamper: bool = False, account: str = "AC" + "0" * 32,
                token: str = TWILIO_TOKEN):
    path = f"/webhooks/twilio/status?nid={n.pk}"
    params = {"MessageSid": n.provider_message_id, "SmsSid": n.provider_message_id, "MessageStatus": status,
              "SmsStatus": status, "AccountSid": account, "From": SENDER, "To": "+4915112345678",
              "ApiVersion": "2010-04-01"}
    if code:
        params["ErrorCode"] = code
    sig = RequestValidator(token).compute_signature(sign_url or PUBLIC + path, params)
    if tamper:
        params["MessageStatus"] = "delivered"
    headers = {} if signature == "" else {"X-Twilio-Signature": signature or sig}
    return Client().post(path, data=params, headers=headers)


def test_twilio_valid_signature_delivers(client=None):
    n = make_notification("sms")
    r = twilio_post(n, "delivered")
    assert r.status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"
    assert n.delivered_at is not None
    assert list(n.events.values_list("kind", "status")) == [("receipt:delivered", "delivered")]


def test_twilio_backup_account_callbacks_are_verified_with_its_own_token(settings):
    backup = "AC" + "1" * 32
    sms = [dict(e, OPTIONS={**e["OPTIONS"], "AUTH_TOKEN": "backup-token"}) if e["NAME"] == "twilio_backup" else e
           for e in settings.PROVIDERS["sms"]]
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": sms}
    n = make_notification("sms")
    # Signed with the primary's token but claiming the backup account: refused.
    assert twilio_post(n, "delivered", account=backup).status_code == 403
    n.refresh_from_db()
    assert n.status == "sent"
    assert twilio_post(n, "delivered", account=backup, token="backup-token").status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"


@pytest.mark.parametrize("attack", ["missing", "wrong_url", "tampered", "forged"])
def test_twilio_bad_signature_is_403_and_changes_nothing(attack):
    n = make_notification("sms")
    kwargs = {"missing": {"signature": ""}, "wrong_url": {"sign_url": "https://evil.example.com/webhooks/x"},
              "tampered": {"tamper": True}, "forged": {"signature": "bm90IGEgc2lnbmF0dXJl"}}[attack]
    r = twilio_post(n, "undelivered", code="30006", **kwargs)
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "invalid_signature"
    n.refresh_from_db()
    assert n.status == "sent"
    assert not n.events.exists()
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == ""


def test_twilio_duplicates_and_reordering_end_delivered_once():
    n = make_notification("sms")
    for status in ["delivered", "delivered", "sent", "queued", "delivered", "sent"]:
        assert twilio_post(n, status).status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"
    kinds = list(n.events.order_by("id").values_list("kind", flat=True))
    assert kinds == ["receipt:delivered", "receipt:sent", "receipt:queued"]


def test_twilio_undelivered_after_sent_fails_with_code_and_30006_marks_number_invalid():
    n = make_notification("sms")
    twilio_post(n, "sent")
    twilio_post(n, "undelivered", code="30006")
    n.refresh_from_db()
    assert (n.status, n.reason) == ("failed", "provider_undelivered")
    assert "30006" in n.reason_detail
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == "landline"
    twilio_post(n, "delivered")  # received later: the provider's last word is the row's (receipt order)
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail) == ("delivered", "", "")
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == "landline"


def test_twilio_30004_records_stop_for_that_sender_only():
    n = make_notification("sms")
    twilio_post(n, "undelivered", code="30004")
    assert list(SmsStop.objects.values_list("phone", "sender")) == [("+4915112345678", SENDER)]
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == ""


def test_twilio_unknown_message_is_acknowledged_and_counted():
    from core.redis_client import get_redis

    before = int(get_redis().get("receipts:unknown") or 0)
    ghost = Notification(id=uuid.uuid4(), provider_message_id="SMdoesnotexist")
    r = twilio_post(ghost, "delivered")
    assert r.status_code == 204
    assert int(get_redis().get("receipts:unknown")) == before + 1
    assert not DeliveryEvent.objects.exists()


# --- SendGrid ------------------------------------------------------------------------------------

def sg_post(key, events: list[dict], *, ts: int | None = None, body: bytes | None = None, sign_body=None,
            headers_override: dict | None = None):
    raw = body if body is not None else json.dumps(events).encode()
    ts = str(ts if ts is not None else int(time.time()))
    sig = base64.b64encode(key.sign(ts.encode() + (sign_body if sign_body is not None else raw),
                                    ec.ECDSA(hashes.SHA256()))).decode()
    headers = {"X-Twilio-Email-Event-Webhook-Signature": sig, "X-Twilio-Email-Event-Webhook-Timestamp": ts}
    if headers_override is not None:
        headers = headers_override
    return Client().post("/webhooks/sendgrid/events", data=raw, content_type="application/json", headers=headers)


def sg_event(n: Notification, event: str, **extra) -> dict:
    return {"email": n.recipient.email, "event": event, "timestamp": int(time.time()),
            "sg_event_id": extra.pop("sg_event_id", uuid.uuid4().hex), "sg_message_id":
            f"{n.provider_message_id}.filter0001.1.2", "notification_id": str(n.pk), **extra}


def test_sendgrid_valid_signature_delivers(sg_key):
    n = make_notification("email")
    r = sg_post(sg_key, [sg_event(n, "processed"), sg_event(n, "delivered")])
    assert r.status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"
    assert n.events.count() == 2


@pytest.mark.parametrize("attack", ["reserialised", "stale", "future", "missing_header", "wrong_key"])
def test_sendgrid_bad_request_is_403_and_changes_nothing(sg_key, attack):
    n = make_notification("email")
    events = [sg_event(n, "bounce", type="bounce", reason="550 5.1.1 no such user", status="5.1.1")]
    raw = json.dumps(events, indent=2).encode()
    if attack == "reserialised":
        # Signed over the original bytes, delivered re-serialised: same JSON value, different bytes.
        r = sg_post(sg_key, events, body=json.dumps(json.loads(raw)).encode(), sign_body=raw)
    elif attack == "stale":
        r = sg_post(sg_key, events, ts=int(time.time()) - 301)
    elif attack == "future":
        r = sg_post(sg_key, events, ts=int(time.time()) + 301)
    elif attack == "missing_header":
        r = sg_post(sg_key, events, headers_override={})
    else:
        r = sg_post(ec.generate_private_key(ec.SECP256R1()), events)
    assert r.status_code == 403
    n.refresh_from_db()
    assert n.status == "sent"
    assert not n.events.exists()
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == ""


def test_sendgrid_duplicate_events_with_and_without_ids_apply_once(sg_key):
    n = make_notification("email")
    with_id = sg_event(n, "delivered", sg_event_id="evt-1")
    without_id = sg_event(n, "processed")
    del without_id["sg_event_id"]
    for _ in range(3):
        assert sg_post(sg_key, [with_id, without_id]).status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"
    assert sorted(n.events.values_list("kind", flat=True)) == ["receipt:delivered", "receipt:processed"]


def test_sendgrid_hard_bounce_fails_and_marks_address_invalid(sg_key):
    n = make_notification("email")
    sg_post(sg_key, [sg_event(n, "processed"), sg_event(n, "bounce", type="bounce", status="5.1.1",
                                                          reason="550 5.1.1 unknown user")])
    n.refresh_from_db()
    assert (n.status, n.reason) == ("failed", "provider_bounced")
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == "sendgrid bounce"


def test_sendgrid_blocked_bounce_fails_but_keeps_address(sg_key):
    n = make_notification("email")
    sg_post(sg_key, [sg_event(n, "bounce", type="blocked", reason="IP blocked")])
    n.refresh_from_db()
    assert n.status == "failed"
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == ""


@pytest.mark.parametrize(("event", "extra", "expected"), [
    ("spamreport", {}, ({"email"}, {})),
    ("unsubscribe", {}, (set(), {"marketing": ["email"]})),
    ("dropped", {"reason": "Unsubscribed Address"}, (set(), {"marketing": ["email"]})),
    ("dropped", {"reason": "Spam Reporting Address"}, ({"email"}, {})),
])
def test_sendgrid_complaints_and_unsubscribes_record_opt_outs(sg_key, event, extra, expected):
    n = make_notification("email", category="marketing")
    sg_post(sg_key, [sg_event(n, event, **extra)])
    prefs = Preferences.objects.get(recipient_id=n.recipient_id)
    assert (set(prefs.opt_outs), prefs.category_opt_outs) == expected


@pytest.mark.parametrize("event", ["spamreport", "unsubscribe"])
@pytest.mark.parametrize("since", ["address_changed", "erased_and_re_created"])
def test_a_complaint_or_unsubscribe_opts_out_no_one_the_message_never_reached(sg_key, event, since):
    """hadvroads 3: a spam report or unsubscribe of a message to an address the user has changed since,
    or to a user erased since (and re-created under the id), opted out the current user's email; like a
    bounce, it now tells nothing about a contact that is not the one the message went to."""
    from preferences.api.erasure import erase_user

    n = make_notification("email", category="marketing")
    event_body = sg_event(n, event)
    if since == "erased_and_re_created":
        erase_user(n.recipient, requested_by="test")
        Recipient.objects.filter(pk=n.recipient_id).update(email=n.recipient.email)  # the same address again
    else:
        Recipient.objects.filter(pk=n.recipient_id).update(email="new@example.com")
    assert sg_post(sg_key, [event_body]).status_code == 204
    assert not Preferences.objects.filter(recipient_id=n.recipient_id).exists()


def test_sendgrid_dropped_invalid_marks_address_invalid(sg_key):
    n = make_notification("email")
    sg_post(sg_key, [sg_event(n, "dropped", reason="Bounced Address")])
    n.refresh_from_db()
    assert n.status == "failed"
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == "sendgrid dropped"


def sg_dropped(n: Notification, reason: str) -> dict:
    """A ``dropped`` event shaped as SendGrid's Event Webhook reference shows it (its example, with
    this notification's message and our custom arg merged in as a top-level key)."""
    return {"email": n.recipient.email, "timestamp": int(time.time()),
            "smtp-id": f"<{n.provider_message_id}@ismtpd-555>", "event": "dropped", "category": "cat facts",
            "sg_event_id": uuid.uuid4().hex, "sg_message_id": f"{n.provider_message_id}.filter0001.16648.5515E0B88.0",
            "reason": reason, "status": "5.0.0", "notification_id": str(n.pk)}


# Every drop reason SendGrid documents (Event Webhook reference, "dropped"; glossary "Drops") and
# what it does: (row status, row reason, the address's invalid mark, channel opt-outs, category opt-outs).
FAILED_ONLY = ("failed", "provider_bounced", "", set(), {})
DROP_REASON_OUTCOMES = {
    "Bounced Address": ("failed", "provider_bounced", "sendgrid dropped", set(), {}),
    "Invalid": ("failed", "provider_bounced", "sendgrid dropped", set(), {}),
    "Unsubscribed Address": ("sent", "", "", set(), {"marketing": ["email"]}),
    "Spam Reporting Address": ("sent", "", "", {"email"}, {}),
    "Invalid SMTPAPI header": FAILED_ONLY,
    "Spam Content": FAILED_ONLY,
    "Recipient List over Package Quota": FAILED_ONLY,
    "Duplicate message": FAILED_ONLY,
    "Invalid recipient list": FAILED_ONLY,  # not documented: never more than this message
}


@pytest.mark.parametrize("reason", list(DROP_REASON_OUTCOMES))
def test_sendgrid_dropped_is_classified_by_its_documented_reason_exactly(sg_key, reason):
    # Issue 23 #2: reasons were matched with startswith("invalid"), so "Invalid SMTPAPI header" (a
    # malformed request: up to 1,000 recipients) marked every recipient's address invalid.
    n = make_notification("email", category="marketing")
    assert sg_post(sg_key, [sg_dropped(n, reason)]).status_code == 204
    n.refresh_from_db()
    recipient = Recipient.objects.get(pk=n.recipient_id)
    prefs = Preferences.objects.filter(recipient_id=n.recipient_id).first()
    opt_outs = (set(prefs.opt_outs), prefs.category_opt_outs) if prefs else (set(), {})
    assert (n.status, n.reason, recipient.email_invalid_reason, *opt_outs) == DROP_REASON_OUTCOMES[reason]
    assert list(n.events.values_list("kind", "detail")) == [
        ("receipt:dropped", f"sendgrid dropped code 5.0.0 {reason}")]


def test_late_processed_never_regresses_delivered(sg_key):
    n = make_notification("email")
    sg_post(sg_key, [sg_event(n, "delivered")])
    sg_post(sg_key, [sg_event(n, "processed"), sg_event(n, "deferred")])
    n.refresh_from_db()
    assert n.status == "delivered"


def test_unconfigured_public_key_refuses(settings, sg_key):
    settings.SENDGRID_WEBHOOK_PUBLIC_KEY = ""
    n = make_notification("email")
    assert sg_post(sg_key, [sg_event(n, "delivered")]).status_code == 403


def test_sendgrid_event_resent_with_fresh_event_ids_is_stored_once(sg_key):
    # SendGrid re-sends an event it thinks we missed with a new sg_event_id: same message, same
    # type, same timestamp. It is the same event: one receipt row.
    n = make_notification("email")
    delivered = sg_event(n, "delivered")
    for event_id in ("evt-a", "evt-b", "evt-c"):
        assert sg_post(sg_key, [{**delivered, "sg_event_id": event_id}]).status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"
    assert list(n.events.values_list("kind", "status", "dedup_key")) == [
        ("receipt:delivered", "delivered",
         f"sendgrid:{n.provider_message_id}.filter0001.1.2:delivered:{delivered['timestamp']}")]


def test_sendgrid_same_type_at_another_instant_is_another_event(sg_key):
    n = make_notification("email")
    first = sg_event(n, "deferred", attempt="1")
    later = {**sg_event(n, "deferred", attempt="2"), "timestamp": first["timestamp"] + 60}
    sg_post(sg_key, [first, later])
    assert list(n.events.order_by("id").values_list("kind", flat=True)) == ["receipt:deferred", "receipt:deferred"]


@pytest.mark.parametrize("with_event_ids", [True, False])
def test_sendgrid_events_of_one_request_stay_apart_per_recipient(sg_key, with_event_ids):
    # One mail/send request for two notifications: one X-Message-Id, so the same provider message
    # id prefix; SendGrid's per-recipient sg_message_id and our notification_id tell them apart,
    # even when both are delivered in the same second.
    a, b = make_notification("email"), make_notification("email")
    Notification.objects.filter(pk=b.pk).update(provider_message_id=a.provider_message_id)
    events = []
    for index, n in enumerate((a, b)):
        event = {**sg_event(n, "delivered"), "sg_message_id": f"{a.provider_message_id}.filter0001.7.ABCDE.{index}"}
        if not with_event_ids:
            del event["sg_event_id"]
        events.append(event)
    events[1]["timestamp"] = events[0]["timestamp"]
    assert sg_post(sg_key, events).status_code == 204
    assert sorted(Notification.objects.filter(pk__in=[a.pk, b.pk]).values_list("status", flat=True)) == [
        "delivered", "delivered"]
    assert DeliveryEvent.objects.filter(notification__in=[a, b], kind="receipt:delivered").count() == 2


def batch_sharing_one_message_id(size: int) -> list[Notification]:
    """``size`` email notifications sent in one mail/send request: one ``X-Message-Id`` for all."""
    rows = [make_notification("email") for _ in range(size)]
    Notification.objects.filter(pk__in=[n.pk for n in rows]).update(provider_message_id=rows[0].provider_message_id)
    for n in rows:
        n.provider_message_id = rows[0].provider_message_id
    return rows


def without_custom_args(n: Notification, event: str, index: int, **extra) -> dict:
    """``event`` for recipient ``index`` of a batch, as SendGrid posts it when our custom arg is
    missing: the recipient's own ``sg_message_id`` (the request id plus a per-recipient suffix) and email."""
    sent = sg_event(n, event, **extra) | {"sg_message_id": f"{n.provider_message_id}.filterdrecv-5645d9c87f-"
                                                             f"7k7ph-1-5E8F1CE1-{index:X}.0"}
    del sent["notification_id"]
    return sent


def test_sendgrid_events_without_custom_args_apply_to_their_own_recipient_of_a_batch(sg_key):
    # Issue 23 #3: matched on the batch's X-Message-Id alone, a hard bounce for recipient #13
    # failed #2 (the last row of that id in a dict) and marked #2's address invalid.
    batch = batch_sharing_one_message_id(15)
    bounced = batch[12]
    events = [without_custom_args(n, "delivered", i) for i, n in enumerate(batch) if n is not bounced]
    events.append(without_custom_args(bounced, "bounce", 12, type="bounce", status="5.1.1",
                                      reason="550 5.1.1 The email account that you tried to reach does not exist"))
    # The address as SendGrid may spell it: case is not significant.
    events[1]["email"] = events[1]["email"].upper()
    assert sg_post(sg_key, events).status_code == 204
    statuses = dict(Notification.objects.filter(pk__in=[n.pk for n in batch]).values_list("pk", "status"))
    assert statuses == {n.pk: ("failed" if n is bounced else "delivered") for n in batch}
    invalid = dict(Recipient.objects.filter(pk__in=[n.recipient_id for n in batch])
                   .values_list("pk", "email_invalid_reason"))
    assert invalid == {n.recipient_id: ("sendgrid bounce" if n is bounced else "") for n in batch}
    assert DeliveryEvent.objects.filter(notification=bounced).get().kind == "receipt:bounce"
    assert DeliveryEvent.objects.count() == 15


@pytest.mark.parametrize("email", ["someone-else@example.com", "", None])
def test_sendgrid_event_of_a_batch_for_an_address_it_was_not_sent_to_is_counted_and_dropped(sg_key, email):
    from core.redis_client import get_redis

    batch = batch_sharing_one_message_id(13)
    before = int(get_redis().get("receipts:unknown") or 0)
    event = without_custom_args(batch[12], "bounce", 12, type="bounce", status="5.1.1", reason="550 5.1.1 unknown")
    if email is None:
        del event["email"]
    else:
        event["email"] = email
    assert sg_post(sg_key, [event]).status_code == 204
    assert int(get_redis().get("receipts:unknown")) == before + 1
    assert set(Notification.objects.filter(pk__in=[n.pk for n in batch]).values_list("status", flat=True)) == {"sent"}
    assert not Recipient.objects.exclude(email_invalid_reason="").exists()
    assert not DeliveryEvent.objects.exists()


def test_sendgrid_delivered_for_a_sending_row_is_sent_at_the_event_time(sg_key):
    # The worker died mid-call: the row is still `sending`, with no provider, message id or attempt.
    n = make_notification("email", status="sending")
    claimed_at = timezone.now() - timedelta(minutes=1)
    Notification.objects.filter(pk=n.pk).update(attempts=1, first_attempt_at=claimed_at, provider_message_id="")
    event = {**sg_event(n, "delivered"), "sg_message_id": "msg-42.filter0001.1.2.0",
             "timestamp": int(claimed_at.timestamp()) + 20}

    assert sg_post(sg_key, [event]).status_code == 204

    n.refresh_from_db()
    assert (n.status, n.provider, n.provider_message_id, n.sent_at) == (
        "delivered", "sendgrid", "msg-42", datetime.fromtimestamp(event["timestamp"], tz=UTC))
    assert list(n.attempts_log.values_list("number", "provider", "outcome", "provider_message_id")) == [
        (1, "sendgrid", "from_receipt", "msg-42")]


def test_a_verified_receipt_is_queued_for_the_receipts_worker_and_applied_there(settings):
    """Outside the in-process tests, a webhook only verifies and buffers (the receipts worker applies
    them): a burst of callbacks never holds the API's threads (adversarial finding: 4,000 Twilio
    callbacks of a 2,000-SMS campaign made OTP accepts wait over a second). The first request queues
    one drain task; the buffer carries everything apply_wire needs."""
    import json

    from core.redis_client import client_for, get_redis
    from notifications import receipts, receipts_buffer, tasks

    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    get_redis().delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG)
    broker = client_for(settings.CELERY_BROKER_URL)
    broker.delete(receipts.RECEIPTS_QUEUE)
    n, other = make_notification("sms"), make_notification("sms")
    assert twilio_post(n, "sent").status_code == 204
    assert twilio_post(n, "delivered").status_code == 204
    assert twilio_post(other, "delivered").status_code == 204
    n.refresh_from_db()
    assert n.status == "sent" and not n.events.exists()  # nothing applied in the requests
    assert broker.llen(receipts.RECEIPTS_QUEUE) == 1  # one drain for the three requests
    task = json.loads(broker.rpop(receipts.RECEIPTS_QUEUE))["headers"]["task"]
    assert task == "notifications.drain_receipts"
    assert get_redis().llen(receipts_buffer.BUFFER_KEY) == 3
    assert tasks.drain_receipts() == {"applied": 3, "duplicate": 0, "unknown": 0}
    n.refresh_from_db()
    other.refresh_from_db()
    assert (n.status, other.status) == ("delivered", "delivered")
    assert list(n.events.order_by("id").values_list("kind", flat=True)) == ["receipt:sent", "receipt:delivered"]
    assert get_redis().llen(receipts_buffer.BUFFER_KEY) == 0
    assert not get_redis().exists(receipts_buffer.DRAIN_FLAG)  # the next request queues a drain again


def test_the_drain_applies_many_requests_receipts_in_one_batch(settings, django_assert_max_num_queries):
    """Twilio posts one request per status: the drain applies a hundred requests' receipts with the
    statements of one batch (one lookup, one INSERT, one UPDATE, marks), not a hundred times those."""
    from core.redis_client import get_redis
    from notifications import receipts, receipts_buffer

    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    get_redis().delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG)
    rows = [make_notification("sms") for _ in range(50)]
    sent = []
    monkey_send = receipts.current_app.send_task
    receipts.current_app.send_task = lambda *a, **kw: sent.append(a[0])
    try:
        for n in rows:
            assert twilio_post(n, "sent").status_code == 204
            assert twilio_post(n, "delivered").status_code == 204
    finally:
        receipts.current_app.send_task = monkey_send
    assert sent == ["notifications.drain_receipts"]  # the first request only
    with django_assert_max_num_queries(12):
        assert receipts.drain_buffer() == {"applied": 100, "duplicate": 0, "unknown": 0}
    assert Notification.objects.filter(pk__in=[n.pk for n in rows], status="delivered").count() == 50


def test_a_receipt_is_applied_in_the_request_when_the_broker_is_down(settings, monkeypatch):
    from notifications import receipts

    def broker_down(*args, **kwargs):
        raise ConnectionError("redis down")

    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    monkeypatch.setattr(receipts.current_app, "send_task", broker_down)
    n = make_notification("sms")
    assert twilio_post(n, "delivered").status_code == 204
    n.refresh_from_db()
    assert n.status == "delivered"


# --- what cannot be stored (issue 12 #2) ---------------------------------------------------------
# A signed webhook that answers 500 is retried by the provider for days. NUL (and a lone UTF-16
# surrogate) in an event's string is replaced with U+FFFD before anything is stored or looked up: the
# event is kept (its damaged id matches no message), the rest of the batch applies, the answer is 204.
# A body that is not UTF-8 or JSON nested beyond what can be read is 400.

UNSTORABLE = ["\u0000", "SM\u0000x", "\ud800"]


@pytest.mark.parametrize("bad", UNSTORABLE, ids=ascii)
@pytest.mark.parametrize("field", ["sg_message_id", "event", "reason", "type", "status", "notification_id",
                                   "sg_event_id", "email", "timestamp"])
def test_sendgrid_unstorable_characters_in_any_event_string_are_stored_replaced_and_answered_204(
        sg_key, field, bad):
    n, other = make_notification("email"), make_notification("email")
    damaged = sg_event(n, "bounce", type="bounce", reason="550 unknown user", status="5.1.1") | {field: bad,
                                                                                                     bad: bad}
    r = sg_post(sg_key, [damaged, sg_event(other, "delivered")])
    assert r.status_code == 204, r.content
    other.refresh_from_db()
    assert other.status == "delivered"  # the rest of the batch applied
    stored = " ".join(DeliveryEvent.objects.exclude(dedup_key=None).values_list("dedup_key", flat=True))
    assert "\x00" not in stored and "\ud800" not in stored


def test_sendgrid_a_damaged_message_id_matches_no_other_message(sg_key):
    n = make_notification("email")
    event = sg_event(n, "delivered") | {"sg_message_id": n.provider_message_id[:5] + "\u0000" +
                                        n.provider_message_id[5:], "notification_id": None}
    assert sg_post(sg_key, [event]).status_code == 204
    n.refresh_from_db()
    assert n.status == "sent"  # "SM12\x0034" is not "SM1234": stripping the NUL would have matched it


@pytest.mark.parametrize("body", [b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
                                  b"\xff\xfe not utf-8", b'[{"event": "delivered"', b"1" * 5000])
def test_sendgrid_signed_body_that_cannot_be_read_is_400(sg_key, body):
    r = sg_post(sg_key, [], body=body)
    assert r.status_code == 400, r.content
    assert not DeliveryEvent.objects.exists()


def test_sendgrid_unsigned_unreadable_body_is_still_403(sg_key):
    r = sg_post(sg_key, [], body=b"[" * 5000, sign_body=b"something else")
    assert r.status_code == 403


@pytest.mark.parametrize("bad", UNSTORABLE, ids=ascii)
@pytest.mark.parametrize("field", ["MessageSid", "MessageStatus", "ErrorCode", "From", "nid"])
def test_twilio_unstorable_characters_are_stored_replaced_and_answered_204(field, bad):
    n = make_notification("sms")
    path = f"/webhooks/twilio/status?nid={n.pk if field != 'nid' else quote(bad.encode('utf-8', 'surrogatepass'))}"
    params = {"MessageSid": n.provider_message_id, "MessageStatus": "undelivered", "ErrorCode": "30004",
              "AccountSid": "AC" + "0" * 32, "From": SENDER, "To": "+4915112345678"}
    if field != "nid":
        params[field] = bad
    body = urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in params.items()})
    # What Django will read back (a lone surrogate's bytes are not UTF-8: decoded as U+FFFD).
    signed = {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in params.items()}
    sig = RequestValidator(TWILIO_TOKEN).compute_signature(PUBLIC + path, signed)
    r = Client().post(path, data=body, content_type="application/x-www-form-urlencoded",
                      headers={"X-Twilio-Signature": sig})
    assert r.status_code == 204, r.content
    stored = list(DeliveryEvent.objects.exclude(dedup_key=None).values_list("dedup_key", "detail", "kind"))
    assert stored and "\x00" not in repr(stored)
    assert "\x00" not in "".join(SmsStop.objects.values_list("sender", flat=True))


# --- a late receipt of a contact the user has changed since ------------------------------------------

def test_a_late_bounce_of_an_old_address_fails_the_message_but_never_marks_the_new_address(sg_key):
    n = make_notification("email")
    old = sg_event(n, "bounce", type="bounce", status="5.1.1", reason="550 5.1.1 unknown user")
    Recipient.objects.filter(pk=n.recipient_id).update(email="new-address@example.com")

    assert sg_post(sg_key, [old]).status_code == 204

    n.refresh_from_db()
    assert (n.status, n.reason) == ("failed", "provider_bounced")
    assert Recipient.objects.filter(pk=n.recipient_id).values_list(
        "email", "email_invalid_reason").get() == ("new-address@example.com", "")


def test_the_same_address_in_another_case_is_still_marked(sg_key):
    n = make_notification("email")
    event = sg_event(n, "bounce", type="bounce", status="5.1.1") | {"email": n.recipient.email.upper()}
    sg_post(sg_key, [event])
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == "sendgrid bounce"


@pytest.mark.parametrize("code", ["30005", "30006", "30004"])
def test_a_late_dead_number_or_stop_of_an_old_phone_never_marks_the_new_one(code):
    n = make_notification("sms")  # sent to +4915112345678
    Recipient.objects.filter(pk=n.recipient_id).update(phone="+4915112345679")

    assert twilio_post(n, "undelivered", code=code).status_code == 204

    n.refresh_from_db()
    assert n.status == "failed"
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == ""
    assert SmsStop.objects.count() == 0


def test_receipts_left_in_the_buffer_by_a_dead_drain_are_drained_after_the_reconciler_tick(settings, monkeypatch):
    """A drain that died (worker killed mid-batch, its task lost) held the flag; once it expires no
    webhook may come for a while: the reconciler's tick queues a drain for what waits."""
    from core.redis_client import get_redis
    from notifications import receipts, receipts_buffer, tasks

    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    redis = get_redis()
    redis.delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG)
    queued = []
    monkeypatch.setattr(receipts.current_app, "send_task", lambda name, **kw: queued.append(name))
    n = make_notification("sms")
    assert twilio_post(n, "delivered").status_code == 204
    assert queued == ["notifications.drain_receipts"]
    queued.clear()  # ...and that task is lost; the flag has expired since:
    redis.delete(receipts_buffer.DRAIN_FLAG)
    monkeypatch.setattr(tasks.scheduler, "reconcile", lambda: {})

    assert tasks.reconcile() == {"receipts_drain_queued": True}
    assert queued == ["notifications.drain_receipts"]
    assert tasks.reconcile() == {"receipts_drain_queued": False}  # one pending already: no second
    assert tasks.drain_receipts() == {"applied": 1, "duplicate": 0, "unknown": 0}
    n.refresh_from_db()
    assert n.status == "delivered"
    assert tasks.reconcile() == {"receipts_drain_queued": False}  # nothing waits

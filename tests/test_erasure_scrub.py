"""An erased user's contacts stay out of delivery logs: the erasure scrubs every address and number
their rows hold (one they had before, one a provider echoed in other case), and a receipt arriving
after the erasure stores none (docs/SECURITY.md, erasure)."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from notifications.models import APIClient, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_webhooks import PUBLIC, sg_event, sg_key, sg_post  # noqa: F401 - sg_key is a fixture

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.PUBLIC_BASE_URL = PUBLIC  # the URL Twilio signs


def delete_user(user_id: str) -> None:
    key = APIClient.objects.create_key(name="support-backend", scopes=EVERY_SCOPE)[1]
    r = Client(headers={"Authorization": f"Api-Key {key}"}).delete(f"/v1/users/{user_id}")
    assert r.status_code == 200, r.content


def sent_row(recipient: Recipient, channel: str = "email") -> Notification:
    return Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel=channel, body="b",
                                       status="sent", provider_message_id=f"SM{uuid.uuid4().hex}")


def bounce(n: Notification, reason: str, email: str) -> dict:
    """A hard bounce as SendGrid documents it (Event Webhook reference, "bounce")."""
    return sg_event(n, "bounce", email=email, type="bounce", status="5.1.1", reason=reason)


def details(n: Notification) -> list[tuple[str, str]]:
    return list(n.events.order_by("created_at", "id").values_list("kind", "detail"))


def test_a_bounce_after_the_erasure_stores_no_address(sg_key):  # noqa: F811
    er1 = Recipient.objects.create(user_id="er1", email="er1@example.com")
    n = sent_row(er1)
    delete_user("er1")
    r = sg_post(sg_key, [bounce(n, "550 5.1.1 <er1.new@example.com> no such user", "er1@example.com")])
    assert r.status_code == 204
    n.refresh_from_db()
    erased = "sendgrid bounce code 5.1.1 550 5.1.1 <[erased]> no such user"
    assert (n.status, n.reason, n.reason_detail) == ("failed", "provider_bounced", erased)
    assert details(n) == [("receipt:bounce", erased)]


def test_a_bounce_of_a_user_not_erased_keeps_its_text(sg_key):  # noqa: F811
    keep = Recipient.objects.create(user_id="keep", email="keep@example.com")
    n = sent_row(keep)
    assert sg_post(sg_key, [bounce(n, "550 5.1.1 <keep@example.com> no such user", "keep@example.com")]
                   ).status_code == 204
    n.refresh_from_db()
    assert n.reason_detail == "sendgrid bounce code 5.1.1 550 5.1.1 <keep@example.com> no such user"


def test_erasure_scrubs_old_addresses_and_any_case(sg_key):  # noqa: F811
    """A bounce echoing the address the user had before changing it, and one echoing the current
    address in other case, both leave the reason, the timeline and the attempt errors."""
    user = Recipient.objects.create(user_id="cu", email="old.user@example.com", phone="+4915112345678")
    old = sent_row(user)
    assert sg_post(sg_key, [bounce(old, "550 5.1.1 <old.user@example.com>: Recipient address rejected",
                                   "old.user@example.com")]).status_code == 204
    DeliveryAttempt.objects.create(notification=old, number=1, provider="sendgrid", outcome="contact_invalid",
                                   error_message="550 mailbox OLD.USER@example.com unavailable")
    Recipient.objects.filter(pk="cu").update(email="Case.User@Example.com", phone="+4915199999999")
    user.refresh_from_db()
    new = sent_row(user)
    assert sg_post(sg_key, [bounce(new, "550 5.1.1 <case.user@example.com> no such user",
                                   "case.user@example.com")]).status_code == 204
    sms = sent_row(user, "sms")
    DeliveryEvent.objects.create(notification=sms, kind="receipt:failed", detail="to +49 151 12345678 refused")

    delete_user("cu")

    rows = {n.pk: n for n in Notification.objects.filter(recipient_id="cu")}
    assert rows[old.pk].reason_detail == "sendgrid bounce code 5.1.1 550 5.1.1 <[erased]>: Recipient address rejected"
    assert rows[new.pk].reason_detail == "sendgrid bounce code 5.1.1 550 5.1.1 <[erased]> no such user"
    assert details(old) == [("receipt:bounce", rows[old.pk].reason_detail)]
    assert details(new) == [("receipt:bounce", rows[new.pk].reason_detail)]
    assert details(sms) == [("receipt:failed", "to [erased] refused")]
    assert DeliveryAttempt.objects.get(notification=old).error_message == "550 mailbox [erased] unavailable"


def test_a_batch_receipt_after_the_erasure_stores_no_address():
    """The bulk path (receipts that only store an event) follows the same rule: a deferral whose
    detail names the address, in a batch with a row of a user not erased."""
    from notifications import receipts

    er3 = Recipient.objects.create(user_id="er3", email="er3@example.com")
    kept = Recipient.objects.create(user_id="kept", email="kept@example.com")
    gone, stays = sent_row(er3), sent_row(kept)
    delete_user("er3")
    batch = [receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:{n.pk}:deferred:1", kind=receipts.DEFERRED,
                              raw="deferred", notification_id=str(n.pk), contact=address,
                              detail=f"451 4.2.2 mailbox {address.upper()} full")
             for n, address in ((gone, "er3@example.com"), (stays, "kept@example.com"))]
    assert receipts.apply_receipts(batch) == {"applied": 2, "duplicate": 0, "unknown": 0}
    assert details(gone) == [("receipt:deferred", "sendgrid deferred 451 4.2.2 mailbox [erased] full")]
    assert details(stays) == [("receipt:deferred", "sendgrid deferred 451 4.2.2 mailbox KEPT@EXAMPLE.COM full")]

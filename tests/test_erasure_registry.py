"""One erasure (docs/SECURITY.md, "Erasure"): every model holding a user's data says what erasure
does to it, and what the registry says holds: open digests are emptied and never sent to a user
re-created inside the window; an unsubscribe link issued before the erasure is dead; unsubscribe
records go with the rest."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps
from django.core import signing
from django.db import models
from django.test import Client

from core import clock
from notifications.events import digests, services
from notifications.events.models import Digest, DigestItem, Event, NotificationType, TypeTemplate
from notifications.models import APIClient, Notification
from preferences.api.erasure import erase_user, personal_data
from preferences.models import Device, Erasure, Preferences, Recipient, Unsubscribe
from preferences.unsubscribe import SALT, UnsubscribeToken, check_live, make_token, read_token

#: Field names that hold a user's data wherever they stand.
PERSONAL_FIELDS = {"user_id", "user_ids", "email", "phone", "push_token"}
RECIPIENT = "preferences.Recipient"
#: Fields that point at a model by its id without a foreign key (a webhook delivery outlives the
#: notification's move to the history): a reference all the same.
PLAIN_REFERENCES = {"notification_id": "notifications.Notification"}
#: The project's apps (staff accounts in django.contrib.auth are not the users erasure is for).
OURS = {"preferences", "notifications", "campaigns"}


def _stored(model) -> bool:
    return model._meta.managed and not model._meta.proxy and model._meta.app_label in OURS


def holds_user_data() -> set[str]:
    """Models that point at a recipient, are a child row of one that does (a cascade or no-action
    reference), or have a field named like a user's data."""
    found: set[str] = set()
    stored = [m for m in apps.get_models() if _stored(m)]
    changed = True
    while changed:
        changed = False
        for model in stored:
            label = model._meta.label
            if label in found:
                continue
            for f in model._meta.get_fields():
                if not f.concrete:
                    continue
                target = f.related_model._meta.label if f.is_relation and f.related_model else None
                child = (target in found and f.many_to_one
                         and f.remote_field.on_delete in (models.CASCADE, models.DO_NOTHING))
                if not f.is_relation and PLAIN_REFERENCES.get(f.name) in found:
                    child = True
                if target == RECIPIENT or child or f.name in PERSONAL_FIELDS:
                    found.add(label)
                    changed = True
                    break
    return found


def test_every_model_holding_user_data_says_what_erasure_does_to_it():
    declared = personal_data()

    assert holds_user_data() - set(declared) == set()
    assert all(how.strip() for how in declared.values())
    assert {label for label in declared if not _stored(apps.get_model(label))} == set()  # no stale names


def test_the_detection_finds_the_models_it_must():
    """The rule above is not vacuous: it sees direct references, child rows and user-id fields."""
    assert {"preferences.Device", "notifications.Notification", "notifications.DeliveryAttempt",
            "notifications.DigestItem", "notifications.Event", "campaigns.SegmentMember",
            "notifications.WebhookDelivery", "notifications.WebhookAttempt"} <= holds_user_data()


# --- what erasure does -------------------------------------------------------------------------------

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def at(monkeypatch):
    current = [T0]
    monkeypatch.setattr(clock, "now", lambda: current[0])
    return current


def digest_type() -> NotificationType:
    kind = NotificationType.objects.create(
        key=f"likes_{uuid.uuid4().hex[:6]}", name="Likes", category="social", channels=["push"],
        digest={"window_seconds": 600, "key": "{{ data.post_id }}"})
    TypeTemplate.objects.create(type=kind, channel="push", locale="en", title="Post {{ data.post_id }}",
                                body="{{ items[0].actor }} liked it")
    return kind


@pytest.mark.django_db(transaction=True)
def test_an_open_digest_is_emptied_and_never_reaches_a_user_re_created_in_its_window(at):
    client = APIClient.objects.create_key(name=f"erase-{uuid.uuid4().hex[:6]}")[0]
    kind = digest_type()
    eve = Recipient.objects.create(user_id=f"eve-{uuid.uuid4().hex[:6]}", email="eve@example.org")
    Device.objects.create(recipient=eve, platform="ios", push_token="old-device")
    services.accept_event(client=client, idempotency_key="e1", fingerprint="f", kind=kind, recipients=[eve],
                          data={"post_id": "p-secret", "actor": "Mallory"})
    digest = Digest.objects.get(recipient=eve)
    assert (digest.closed_at, digest.key, DigestItem.objects.filter(digest=digest).count()) == (None, "p-secret", 1)

    at[0] = T0 + timedelta(seconds=60)
    erase_user(eve, requested_by="test")

    digest.refresh_from_db()
    assert (digest.closed_at, digest.item_count, digest.key) == (T0 + timedelta(seconds=60), 0, "")
    assert DigestItem.objects.filter(digest=digest).count() == 0
    assert Event.objects.get(idempotency_key="e1").data == {}
    # eve comes back inside the window with a new device; the window ends: nothing is made for her.
    Recipient.objects.filter(pk=eve.pk).update(email="eve2@example.org")
    Device.objects.create(recipient=eve, platform="ios", push_token="new-device")
    at[0] = T0 + timedelta(seconds=700)
    assert digests.close_due() == 0
    assert Notification.objects.filter(recipient=eve).count() == 0
    # A new event after the erasure opens a digest of its own, as for anyone.
    services.accept_event(client=client, idempotency_key="e2", fingerprint="f", kind=kind, recipients=[eve],
                          data={"post_id": "p2", "actor": "Ana"})
    assert Digest.objects.filter(recipient=eve, closed_at__isnull=True).values_list("key", flat=True).get() == "p2"


@pytest.mark.django_db(transaction=True)
def test_an_event_to_many_keeps_its_shared_data_when_one_of_them_is_erased(at):
    client = APIClient.objects.create_key(name=f"erase-{uuid.uuid4().hex[:6]}")[0]
    kind = digest_type()
    eve, bob = (Recipient.objects.create(user_id=f"{n}-{uuid.uuid4().hex[:6]}") for n in ("eve", "bob"))
    services.accept_event(client=client, idempotency_key="e1", fingerprint="f", kind=kind, recipients=[eve, bob],
                          data={"post_id": "p1", "actor": "Ana"})

    erase_user(eve, requested_by="test")

    assert Event.objects.get(idempotency_key="e1").data == {"post_id": "p1", "actor": "Ana"}
    assert Digest.objects.get(recipient=bob).closed_at is None
    assert DigestItem.objects.filter(digest__recipient=bob).count() == 1


@pytest.fixture
def mail_client():
    return Client(enforce_csrf_checks=True)


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post"])
def test_a_link_issued_before_the_erasure_is_404_and_writes_nothing(mail_client, at, method):
    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    link = UnsubscribeToken(user_id="eve", category="marketing")
    token = make_token(link)  # at T0
    at[0] = T0 + timedelta(hours=1, milliseconds=500)
    erase_user(eve, requested_by="test")
    Recipient.objects.filter(pk="eve").update(email="eve-new@example.org")  # re-created

    response = getattr(mail_client, method)(f"/u/{token}", {"List-Unsubscribe": "One-Click"})

    assert response.status_code == 404
    assert (Preferences.objects.count(), Unsubscribe.objects.count()) == (0, 0)
    # A link of an email sent after the erasure (a later second: links are signed to the second and
    # one of the erasure's own second counts as before it) works.
    at[0] = T0 + timedelta(hours=1, milliseconds=900)
    assert mail_client.post(f"/u/{make_token(link)}", {"List-Unsubscribe": "One-Click"}).status_code == 404
    at[0] = T0 + timedelta(hours=1, seconds=1)
    fresh = mail_client.post(f"/u/{make_token(link)}", {"List-Unsubscribe": "One-Click"})
    assert fresh.status_code == 200
    assert Unsubscribe.objects.filter(recipient_id="eve").count() == 1


@pytest.mark.django_db
def test_erasure_deletes_the_unsubscribe_records_and_a_token_knows_when_it_was_signed(mail_client, at):
    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    token = make_token(UnsubscribeToken(user_id="eve", category="marketing"))
    assert read_token(token).issued_at == T0
    assert mail_client.post(f"/u/{token}", {"List-Unsubscribe": "One-Click"}).status_code == 200
    assert Unsubscribe.objects.filter(recipient=eve).count() == 1

    erase_user(eve, requested_by="test")

    assert Unsubscribe.objects.filter(recipient=eve).count() == 0
    assert Preferences.objects.filter(recipient=eve).count() == 0


@pytest.mark.django_db
def test_an_erasure_and_a_links_issue_are_stamped_on_the_platform_clock(at):
    """The platform clock (here months from the host's) stamps the erasure's record and the
    recipient's mark with one instant, and a link's issue, which the erasure is compared with; the
    signature's own timestamp (the host's) only bounds the link's age."""
    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    link = UnsubscribeToken(user_id="eve", category="marketing")
    before = read_token(make_token(link))
    at[0] = T0 + timedelta(seconds=60)
    erasure, _ = erase_user(eve, requested_by="test")
    eve.refresh_from_db()
    assert (erasure.erased_at, Erasure.objects.get(pk=erasure.pk).erased_at, eve.erased_at) == (
        T0 + timedelta(seconds=60),) * 3
    at[0] = T0 + timedelta(seconds=120)
    after = read_token(make_token(link))
    assert (before.issued_at, after.issued_at) == (T0, T0 + timedelta(seconds=120))
    with pytest.raises(Recipient.DoesNotExist):
        check_live(before)
    assert check_live(after) == eve
    # A link made before tokens carried the platform's second: its signature's second, as before.
    signed = time.time()
    old = signing.dumps({"u": "eve", "c": "marketing", "ch": "email"}, salt=SALT, compress=True)
    assert abs(read_token(old).issued_at.timestamp() - signed) < 2


@pytest.mark.django_db
def test_an_erased_users_dead_letters_leave_the_list_and_cannot_be_replayed():
    """Every road (hroads, finding 2): a dead letter replayed after the erasure sent an empty push to
    the device of the user re-created under the same id."""
    from notifications.models import DeliveryEvent
    from notifications.services import replay_dead_letters

    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    n = Notification.objects.create(id=uuid.uuid4(), recipient=eve, channel="push", title="EP secret",
                                    body="EP secret push", status="failed", reason="configuration_error",
                                    dead_lettered_at=clock.now())

    erase_user(eve, requested_by="test")

    n.refresh_from_db()
    assert (n.status, n.reason, n.dead_lettered_at, n.body) == ("failed", "configuration_error", None, "")
    assert replay_dead_letters([n.pk], by="admin") == 0
    assert list(DeliveryEvent.objects.filter(notification=n).values_list("kind", flat=True)) == [
        "dead_letter_withdrawn"]


@pytest.mark.django_db
def test_a_fallback_channel_is_not_replayed_once_the_next_channel_reached_the_user():
    """Every road (hroads, finding 4): replaying a fallback type's push after its email went out
    delivered both."""
    from notifications.services import replay_dead_letters

    r = Recipient.objects.create(user_id="fb", email="fb@example.org")
    push = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="push", body="b", status="failed",
                                       reason="configuration_error", dead_lettered_at=clock.now())
    email = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", body="b", status="queued",
                                        fallback_after=push.pk)
    Notification.objects.filter(pk=email.pk).update(status="delivered")
    assert replay_dead_letters([push.pk], by="admin") == 0
    Notification.objects.filter(pk=email.pk).update(status="failed")
    assert replay_dead_letters([push.pk], by="admin") == 1


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/users/eve/inbox", "/v1/users/eve/notifications"])
def test_a_cursor_issued_before_the_erasure_reads_nothing_of_the_user_re_created_since(path):
    """A per-user cursor binds the user's latest erasure: after ``DELETE /v1/users/eve`` and a re-created
    ``eve``, the old cursor is refused (the list's bad-cursor answer, nothing read) and a fresh listing works."""
    from core.api.scopes import Scope
    from notifications.inbox import store

    client, key = APIClient.objects.create_key(name="app", scopes=[Scope.INBOX, Scope.READ])
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    ids = [uuid.uuid4() for _ in range(3)]
    Notification.objects.bulk_create([Notification(id=i, recipient=eve, channel="in_app", status="sent", body="b",
                                                   client=client) for i in ids])
    start = clock.now() - timedelta(hours=1)
    store.write([store.NewItem(i, "eve", "order", "", f"t{k}", f"b{k}", {}, start + timedelta(minutes=k), None)
                 for k, i in enumerate(ids)])
    first = http.get(path, {"limit": 1})
    assert first.status_code == 200, first.content
    cursor = first.json()["next_cursor"]
    assert cursor and http.get(path, {"limit": 1, "cursor": cursor}).status_code == 200  # live before

    erase_user(eve, requested_by="test")
    Recipient.objects.filter(pk="eve").update(email="eve-new@example.org")  # re-created

    stale = http.get(path, {"limit": 1, "cursor": cursor})
    assert stale.status_code in (400, 422), stale.content
    assert stale.json()["error"]["fields"][0]["field"] == "cursor"
    assert http.get(path, {"limit": 1}).status_code == 200


@pytest.mark.django_db
def test_a_bounce_after_the_erasure_reopens_no_fallback_channel_of_the_erased_user():
    """hadvroads 1: a bounce of the email sent before ``DELETE /v1/users/e3`` reopened the in_app
    channel that send had made "not needed", and the erased user's order reached the inbox again.
    Erasure cancels such channels (``recipient_erased``), so nothing is left to reopen."""
    from notifications.events import fallback
    from notifications.models import DeliveryEvent

    r = Recipient.objects.create(user_id="e3", email="e3@example.org")
    email = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", body="b", status="sent")
    in_app = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="in_app", body="Order 77",
                                         status="suppressed", reason="fallback_not_needed", fallback_after=email.pk)

    erasure, _ = erase_user(r, requested_by="test")

    assert fallback.reopen([(email.pk, "email")], "email: provider_bounced") == 0
    in_app.refresh_from_db()
    assert (in_app.status, in_app.reason, in_app.body) == ("cancelled", "recipient_erased", "")
    assert list(DeliveryEvent.objects.filter(notification=in_app).values_list("kind", "reason")) == [
        ("cancelled", "recipient_erased")]
    assert erasure.notifications_cancelled == 1

"""A sensitive type's digest key (issue 23 #7): it was stored, answered and shown to support as a plain
SHA-256 prefix (``dk-4a8e…``), and the code it was made of came back from trying the million 6-digit
codes in a second. It is now a keyed hash (HMAC-SHA256, key derived from SECRET_KEY), never shown in
the admin or the timeline, and a digest opened before the deploy keeps collecting its events.

In-process (rolled-back transactions), the platform clock frozen.
"""

from __future__ import annotations

import hashlib
import importlib
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.db import connection

from campaigns.roles import SUPPORT
from notifications.events import digests, services
from notifications.events.models import Digest, DigestItem, NotificationType, TypeTemplate
from notifications.models import APIClient, DeliveryEvent
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CODE = "493817"


@pytest.fixture
def frozen_at(monkeypatch):
    at = [T0]
    monkeypatch.setattr("core.clock.now", lambda: at[0])
    return at


@pytest.fixture
def api_client():
    return APIClient.objects.create_key(name="auth-service", scopes=EVERY_SCOPE)[0]


@pytest.fixture
def sign_in_alerts():
    kind = NotificationType.objects.create(key="sign_in_alert", name="Sign-in", category="security",
                                           channels=["push"], sensitive=True,
                                           digest={"window_seconds": 600, "key": "{{ data.code }}"})
    TypeTemplate.objects.create(type=kind, channel="push", locale="en", title="Sign-in",
                                body="{{ count }} sign-in(s)")
    return kind


@pytest.fixture
def alice():
    r = Recipient.objects.create(user_id="alice", email="alice@example.org")
    Device.objects.create(recipient=r, platform="ios", push_token="tok-alice")
    return r


def accept(client, kind, recipient, data):
    return services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                                 recipients=[recipient], data=data)


def plain(code: str) -> str:
    return "dk-" + hashlib.sha256(code.encode()).hexdigest()[:40]


def test_the_stored_key_is_not_a_plain_hash_of_the_code(api_client, sign_in_alerts, alice, frozen_at, settings):
    accept(api_client, sign_in_alerts, alice, {"code": CODE})
    (digest,) = Digest.objects.filter(recipient=alice)
    assert digest.key.startswith("dk-") and len(digest.key) == 43
    # the attack: try every 6-digit code against the stored key
    assert not any(plain(f"{n:06d}") == digest.key for n in range(1_000_000))
    assert digest.key == digests.keyed_hash(plain(CODE)[3:])
    settings.SECRET_KEY = "another secret"
    assert digests.keyed_hash(plain(CODE)[3:]) != digest.key  # without the server's secret, no match


@pytest.fixture
def supporter(fast_password_hashing):
    user = User.objects.create_user("sam", is_staff=True)
    user.groups.add(Group.objects.get(name=SUPPORT))
    return User.objects.get(pk=user.pk)


def test_support_never_sees_a_sensitive_types_digest_key(client, supporter, api_client, sign_in_alerts, alice,
                                                         frozen_at):
    event = accept(api_client, sign_in_alerts, alice, {"code": CODE}).event
    (digest,) = Digest.objects.filter(recipient=alice)
    frozen_at[0] = T0 + timedelta(seconds=600)
    assert digests.close_due() == 1
    client.force_login(supporter)
    pages = [client.get("/admin/notifications/digest/"),
             client.get(f"/admin/notifications/digest/{digest.pk}/change/"),
             client.get(f"/admin/notifications/event/{event.pk}/change/")]
    for page in pages:
        text = page.content.decode()
        assert page.status_code == 200
        assert digest.key not in text and digest.key[3:15] not in text and CODE not in text
        assert Digest.HIDDEN_KEY in text
    details = list(DeliveryEvent.objects.filter(notification__digest=digest).values_list("detail", flat=True))
    assert details and all(digest.key not in d and Digest.HIDDEN_KEY in d for d in details)


def test_a_digest_opened_before_the_deploy_keeps_collecting_its_events(api_client, sign_in_alerts, alice,
                                                                       frozen_at):
    """Opened by the old code (a plain SHA-256 key), rewritten by migration 0027, joined by the new code."""
    old = Digest.objects.create(type=sign_in_alerts, recipient=alice, client=api_client, key=plain(CODE),
                                window_seconds=600, channels=["push"], opened_at=T0,
                                closes_at=T0 + timedelta(minutes=10))
    other = NotificationType.objects.create(key="likes", name="Likes", category="social", channels=["push"],
                                            digest={"window_seconds": 600, "key": "{{ data.post }}"})
    long_key = Digest.objects.create(type=other, recipient=alice, client=api_client, key=plain("x" * 300),
                                     window_seconds=600, channels=["push"], opened_at=T0,
                                     closes_at=T0 + timedelta(minutes=10))
    migration = importlib.import_module("notifications.migrations.0027_digest_keyed_hash")
    migration.to_keyed(apps, SimpleNamespace(connection=connection))
    old.refresh_from_db()
    long_key.refresh_from_db()
    assert old.key == digests.keyed_hash(plain(CODE)[3:])
    assert long_key.key == plain("x" * 300)  # not a sensitive type's: a long key's plain hash stays
    frozen_at[0] = T0 + timedelta(minutes=2)
    accepted = accept(api_client, sign_in_alerts, alice, {"code": CODE})
    assert accepted.digests == [old]
    assert DigestItem.objects.filter(digest=old).count() == 1
    assert Digest.objects.filter(type=sign_in_alerts).count() == 1

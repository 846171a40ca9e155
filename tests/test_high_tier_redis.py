"""The high tier's Redis round trips per OTP (docs/PERFORMANCE.md, "What an OTP costs"): the sent
marker lookup, one script before the call (breaker, bulkhead, budget: tests/test_isolation_admit.py)
and one pipeline after it (the slot back, the breaker's counts, the sent marker), each rule's part
supplied by its owner (core/redis_client.py ``Round``). In-process against a real emulator
subprocess, Postgres and Redis."""

from __future__ import annotations

import uuid
from unittest import mock

import pytest
import redis
from redis.connection import AbstractConnection

from core.redis_client import Round, get_redis
from notifications import sent_markers
from notifications.delivery import record
from notifications.delivery.pipeline import send_notifications
from notifications.models import Notification
from preferences.models import Recipient
from providers import isolation
from providers.registry import reset_backends
from tests.providers.conftest import twilio_options

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sms_provider(settings, module_emulator):
    module_emulator.reset()
    name = f"tw{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [{
        "NAME": name, "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
        "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}]}
    reset_backends()
    yield name
    reset_backends()
    keys = list(get_redis().scan_iter(f"*:{name}*"))
    if keys:
        get_redis().delete(*keys)


def _otp() -> Notification:
    r = Recipient.objects.create(user_id=f"htr-{uuid.uuid4().hex[:8]}", phone="+15557770001")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", priority="high", body="123456",
                                       status="queued", sensitive=True)


def _breaker_counts(provider: str) -> dict:
    found: dict = {}
    for key in get_redis().scan_iter(f"breaker:{provider}:w:*"):
        for field, value in get_redis().hgetall(key).items():
            found[field.decode()] = found.get(field.decode(), 0) + int(value)
    return found


@pytest.mark.django_db
def test_an_otp_takes_three_round_trips_to_redis_and_leaves_every_rule_as_the_separate_calls_did(
        sms_provider, module_emulator):
    send_notifications([_otp().pk])  # warm: scripts loaded, clients made
    n = _otp()
    trips = mock.Mock(wraps=AbstractConnection.send_packed_command)

    with mock.patch.object(AbstractConnection, "send_packed_command", lambda self, *a, **k: trips(self, *a, **k)):
        send_notifications([n.pk])

    n.refresh_from_db()
    assert n.status == "sent" and module_emulator.count() == 2
    assert trips.call_count == 3  # marker lookup; breaker + bulkhead + budget; slot + breaker + marker
    assert get_redis().exists(f"sent:{n.pk}") == 1
    assert get_redis().ttl(f"sent:{n.pk}") > 47 * 3600
    assert isolation.slots_in_use(sms_provider, "high") == 0
    assert _breaker_counts(sms_provider) == {"ok": 2}


@pytest.mark.django_db
def test_the_sent_marker_is_written_before_the_record_so_a_crash_between_them_never_resends(
        sms_provider, module_emulator):
    """The kind of failure the marker is for: the provider accepted, then the worker could not record
    (Postgres gone, killed). Before, the high tier wrote the marker only after the record."""
    n = _otp()
    with mock.patch.object(record, "record_sent", side_effect=RuntimeError("database went away")):
        send_notifications([n.pk])
    n.refresh_from_db()
    assert n.status == "sending" and module_emulator.count() == 1
    assert sent_markers.find_sent([n.pk]) == {str(n.pk)}

    Notification.objects.filter(pk=n.pk).update(status="queued")  # the reconciler re-drives it
    send_notifications([n.pk])
    n.refresh_from_db()
    assert (n.status, module_emulator.count()) == ("sent", 1)  # found the marker: not sent again


def test_a_round_reads_each_answer_by_its_owner_and_survives_a_flushed_script_cache():
    key = f"round-{uuid.uuid4().hex[:6]}"
    get_redis().script_flush()
    batch = Round()
    batch.call(lambda answer: ("set", answer), "SET", key, "1")
    batch.known("no command")
    batch.script(lambda answer: ("script", answer), "return redis.call('GET', KEYS[1])", [key], [])
    assert batch.send() == [("set", True), "no command", ("script", b"1")]
    get_redis().delete(key)
    assert Round().send() == []


def test_redis_down_gives_each_owner_its_error_and_each_fails_as_its_rule_says(caplog, monkeypatch):
    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    monkeypatch.setattr(redis.client.Pipeline, "execute", down)
    batch = Round()
    isolation.queue_release_slots(batch, "pdown", "high", ["s1"])
    isolation.queue_record_calls(batch, "pdown", ok=1)
    sent_markers.queue_mark_sent(batch, ["n1"])
    assert batch.send() == [None, "closed", None]
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.levelname == "WARNING"] == [
        "bulkhead slots for pdown not released (they expire)",
        "circuit breaker for pdown not updated, Redis unavailable", "sent marker not written, Redis unavailable"]

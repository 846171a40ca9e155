"""/healthz, /readyz, ``manage.py doctor`` and the provider-health admin page, in-process against the
tests' Postgres database and Redis database."""

from __future__ import annotations

import base64
import io
import socket
import time
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from core.redis_client import client_for
from notifications import health, scheduler
from notifications.models import DeliveryAttempt, Notification
from preferences.models import Recipient

pytestmark = pytest.mark.django_db


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def heartbeat():
    """Set (or remove, with None) the scheduler heartbeat to ``age`` seconds ago."""
    r = client_for(settings.REDIS_URL)

    def set_age(age: float | None) -> None:
        if age is None:
            r.delete(health.HEARTBEAT_KEY)
        else:
            r.set(health.HEARTBEAT_KEY, f"{time.time() - age:.3f}")

    yield set_age
    r.delete(health.HEARTBEAT_KEY)


# --- /healthz, /readyz ------------------------------------------------------------------------------

def test_healthz_is_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_ok_after_the_scheduler_ran(client, heartbeat):
    heartbeat(None)
    scheduler.release_due()  # what beat runs every second; writes the heartbeat
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert "failing" not in body
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "postgres": True, "redis": True, "broker": True, "beat": True}


def test_readyz_503_names_beat_when_its_heartbeat_is_stale(client, heartbeat):
    heartbeat(45)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["failing"] == ["beat"]
    assert body["checks"]["beat"]["error"].startswith("last scheduler heartbeat 45 s ago (limit 30 s)")
    assert body["checks"]["postgres"] == {"ok": True, "ms": body["checks"]["postgres"]["ms"]}


def test_readyz_503_names_beat_when_it_never_ran(client, heartbeat):
    heartbeat(None)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["beat"]
    assert response.json()["checks"]["beat"]["error"].startswith("no scheduler heartbeat")


def test_readyz_503_names_redis_when_its_port_is_closed(client, heartbeat, settings):
    heartbeat(1)
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    # The heartbeat lives in Redis too, so beat cannot be confirmed either; the broker is elsewhere.
    assert body["failing"] == ["redis", "beat"]
    assert body["checks"]["redis"]["error"] == "Redis unreachable (ConnectionError)"
    assert body["checks"]["broker"]["ok"] is True
    assert "127.0.0.1" not in response.content.decode()  # no addresses in the public body


def test_readyz_503_names_the_broker_when_it_is_down(client, heartbeat, settings):
    heartbeat(1)
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{closed_port()}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["broker"]


# --- doctor ---------------------------------------------------------------------------------------

def sendgrid_key_pair(directory) -> tuple[str, str]:
    """A SendGrid-style signing key written as the emulator reads it, and its public half as the
    platform's setting holds it."""
    key = ec.generate_private_key(ec.SECP256R1())
    path = directory / f"signing-{uuid.uuid4().hex}.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return str(path), base64.b64encode(der).decode()


def doctor(*args) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("doctor", "--skip", "workers", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def good_config(settings, monkeypatch, tmp_path):
    """The emulator everywhere, signing with the key SENDGRID_WEBHOOK_PUBLIC_KEY verifies, a local
    PUBLIC_BASE_URL."""
    for var in ("TWILIO_ACCOUNT_SID", "SENDGRID_API_KEY", "SMTP_HOST", "FCM_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    signing_file, settings.SENDGRID_WEBHOOK_PUBLIC_KEY = sendgrid_key_pair(tmp_path)
    monkeypatch.setenv("EMULATOR_SENDGRID_SIGNING_KEY_FILE", signing_file)
    settings.PUBLIC_BASE_URL = "http://127.0.0.1:8000"
    return settings


def test_doctor_passes_a_good_configuration(good_config):
    code, out = doctor()
    assert code == 0, out
    assert "FAIL" not in out
    assert "OK    SENDGRID_WEBHOOK_PUBLIC_KEY decodes (secp256r1 ECDSA key)" in out
    assert "OK    providers: sms: twilio (emulator) → twilio_backup (emulator); primary twilio" in out
    assert "OK    providers: email: sendgrid (emulator) → smtp (emulator); primary sendgrid" in out
    assert "INFO  providers: sms: twilio talks to the local emulator; for the real service set " \
           "TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM_NUMBER" in out
    assert "OK    time zone data present (Europe/Berlin found)" in out
    assert "OK    migrations: all applied" in out
    assert "OK    Redis (REDIS_URL) answers" in out
    assert "SKIP  workers: skipped" in out
    assert out.rstrip().endswith("doctor: everything checked is fine (0 warning(s)).")


def test_doctor_fails_without_the_sendgrid_key(good_config):
    good_config.SENDGRID_WEBHOOK_PUBLIC_KEY = ""
    code, out = doctor()
    assert code == 1
    assert ("FAIL  SENDGRID_WEBHOOK_PUBLIC_KEY is not set: every SendGrid delivery receipt will be refused with "
            "403") in out
    assert out.rstrip().endswith("doctor: 1 problem(s), 0 warning(s). Fix the FAIL lines.")


def test_doctor_fails_on_an_undecodable_sendgrid_key(good_config):
    good_config.SENDGRID_WEBHOOK_PUBLIC_KEY = "bm90LWEta2V5"  # base64 of "not-a-key"
    code, out = doctor()
    assert code == 1
    assert "FAIL  SENDGRID_WEBHOOK_PUBLIC_KEY does not decode as a base64 DER public key" in out


def test_doctor_fails_when_the_emulator_signs_with_another_key(good_config, monkeypatch, tmp_path):
    """A shell that exported another stack's .run/env keeps that stack's public key: every receipt
    the emulator signs would be refused."""
    other_file, _ = sendgrid_key_pair(tmp_path)
    monkeypatch.setenv("EMULATOR_SENDGRID_SIGNING_KEY_FILE", other_file)
    code, out = doctor()
    assert code == 1
    assert (f"FAIL  SENDGRID_WEBHOOK_PUBLIC_KEY is not the public half of the emulator's signing key {other_file}: "
            "every emulated SendGrid receipt will be refused with 403") in out
    assert out.rstrip().endswith("doctor: 1 problem(s), 0 warning(s). Fix the FAIL lines.")


@pytest.mark.parametrize("url", ["notify.example.com", "ftp://notify.example.com", "https://", ""])
def test_doctor_fails_on_a_public_base_url_that_is_not_absolute_http(good_config, url):
    good_config.PUBLIC_BASE_URL = url
    code, out = doctor()
    assert code == 1
    assert f"FAIL  PUBLIC_BASE_URL {url!r} is not an absolute http(s) URL" in out


def test_doctor_fails_on_a_loopback_public_base_url_with_real_credentials(good_config, monkeypatch):
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC" + "1" * 32)
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "token")
    monkeypatch.setenv("TWILIO_FROM_NUMBER", "+15005550006")
    monkeypatch.setenv("TWILIO_STATUS_CALLBACK_URL", "https://notify.example.com/webhooks/twilio/status")
    sms = good_config.PROVIDERS["sms"][0]
    good_config.PROVIDERS = {**good_config.PROVIDERS,
                             "sms": [{**sms, "OPTIONS": {**sms["OPTIONS"], "BASE_URL": None}}]}
    code, out = doctor("--skip", "metrics")
    assert code == 1
    assert "OK    providers: sms: twilio (real); primary twilio" in out
    assert ("FAIL  PUBLIC_BASE_URL 'http://127.0.0.1:8000' is a loopback address, but real providers (twilio) "
            "must reach the webhooks from the internet") in out
    assert "WARN  providers: real credentials are set for twilio but email, push still use the emulator" in out

    good_config.PUBLIC_BASE_URL = "https://notify.example.com"
    code, out = doctor("--skip", "metrics")
    assert code == 0, out
    assert "OK    PUBLIC_BASE_URL is https://notify.example.com" in out


def test_doctor_names_missing_env_for_a_real_provider(good_config, monkeypatch):
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC" + "1" * 32)
    monkeypatch.delenv("TWILIO_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("TWILIO_FROM_NUMBER", raising=False)
    good_config.PUBLIC_BASE_URL = "https://notify.example.com"
    sms = good_config.PROVIDERS["sms"][0]
    good_config.PROVIDERS = {**good_config.PROVIDERS,
                             "sms": [{**sms, "OPTIONS": {**sms["OPTIONS"], "BASE_URL": None}}]}
    code, out = doctor()
    assert code == 1
    assert ("FAIL  providers: sms: twilio is configured for real use but TWILIO_AUTH_TOKEN, TWILIO_FROM_NUMBER "
            "are not set") in out


def test_doctor_says_when_no_worker_answers(good_config):
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        # The tests' own Redis database has no workers.
        call_command("doctor", "--timeout", "0.3", "--skip", "migrations", stdout=out)
    assert exited.value.code == 1
    assert "FAIL  workers: no Celery worker answered within 0.3 s, so no queue is consumed" in out.getvalue()


# --- provider health admin page -----------------------------------------------------------------------

def test_provider_health_page_is_staff_only(client, django_user_model):
    assert client.get("/admin/provider-health/").status_code == 302
    user = django_user_model.objects.create_user("not-staff", password="pw-123-long")
    client.force_login(user)
    response = client.get("/admin/provider-health/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("minutes", ["abc", "-1", "0", "1e3", "²", "1441", ""])
def test_provider_health_refuses_a_window_that_is_not_whole_minutes_in_range_naming_it(admin_client, minutes):
    from notifications.health_admin import WINDOW_MAX_MINUTES

    response = admin_client.get("/admin/provider-health/", {"minutes": minutes})
    assert response.status_code == 400
    assert response.content.decode() == (f"minutes: a whole number of minutes from 1 to {WINDOW_MAX_MINUTES}, "
                                          f"not {minutes!r}")
    assert admin_client.get("/admin/provider-health/", {"minutes": str(WINDOW_MAX_MINUTES)}).status_code == 200


def test_provider_health_page_shows_providers_calls_queues_and_dead_letters(admin_client):
    r = Recipient.objects.create(user_id=f"h-{uuid.uuid4().hex[:8]}", phone="+4915100000001")
    n = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="failed",
                                    reason="attempts_exhausted", dead_lettered_at=timezone.now())
    for outcome in ("accepted", "accepted", "transient", "contact_invalid"):
        DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome=outcome)
    old = DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="permanent")
    DeliveryAttempt.objects.filter(pk=old.pk).update(created_at=old.created_at.replace(year=2020))  # outside

    from tests.conftest import reset_isolation

    reset_isolation()
    response = admin_client.get("/admin/provider-health/")
    assert response.status_code == 200
    ctx = response.context_data
    rows = {(p["channel"], p["name"]): p for p in ctx["providers"]}
    assert list(rows) == [("sms", "twilio"), ("sms", "twilio_backup"), ("email", "sendgrid"), ("email", "smtp"),
                          ("push", "fcm")]
    twilio = rows[("sms", "twilio")]
    assert (twilio["primary"], twilio["mode"], twilio["by_outcome"], twilio["total"], twilio["error_ratio"]) == (
        True, "emulator", [2, 1, 0, 1, 0], 4, "25.0%")
    assert rows[("email", "smtp")]["primary"] is False
    assert rows[("email", "sendgrid")]["by_outcome"] == [0, 0, 0, 0, 0]
    assert twilio["breaker"] == "closed"
    assert twilio["budget"] == "1,000/s (100/s reserved for high); ≤ 6 high / 32 standard calls at once"
    assert ctx["minutes"] == 15 and ctx["truncated"] is False
    assert ctx["pipeline"]["dead_letters"] == 1
    from core.queues import ALL_QUEUES

    assert [q["name"] for q in ctx["queues"]] == list(ALL_QUEUES)
    html = response.content.decode()
    assert "Provider health" in html and "reserved for high" in html and "high.sms" in html

    assert admin_client.get("/admin/provider-health/?minutes=60").context_data["minutes"] == 60
    assert admin_client.get("/admin/provider-health/?minutes=999").status_code == 400  # not clamped: named
    index = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/provider-health/"' in index

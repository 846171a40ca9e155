"""Emulator mode is explicit (issue 11 #5): no built-in credential is ever used or accepted outside
it, and a provider listed without its credentials fails ``manage.py check`` naming the variables.

``config/provider_settings.py`` builds ``settings.PROVIDERS``; ``providers/registry.py`` checks it;
the Twilio webhook refuses the emulator's public token outside emulator mode; ``manage.py doctor``
names the backup account's missing variables.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid

import pytest
from django.core.management import call_command
from django.test import Client
from twilio.request_validator import RequestValidator

from bench.stack import ROOT
from config.provider_settings import build_providers
from notifications.models import Notification
from preferences.models import Recipient
from providers.registry import check_providers_configured

EMULATOR_TOKEN = "emulator-auth-token"  # public: providers/emulator_credentials.py
BACKUP_SID = "AC" + "1" * 32
REAL_TWILIO = {"TWILIO_ACCOUNT_SID": "AC" + "a" * 32, "TWILIO_AUTH_TOKEN": "real-primary-token",
               "TWILIO_FROM_NUMBER": "+14155550100"}
REAL_REST = {"SENDGRID_API_KEY": "SG.real-key", "EMAIL_FROM": "notify@example.org",
             "FCM_CREDENTIALS": "/etc/notify/fcm.json", "FCM_PROJECT_ID": "notify-prod"}


def build(environ: dict, mode: str) -> dict:
    return build_providers(environ, mode, emulator_url="http://127.0.0.1:8900", emulator_smtp_port=8925,
                           public_base_url="https://notify.example.org", timeout=10.0)


def entry(providers: dict, name: str) -> dict:
    return next(e for entries in providers.values() for e in entries if e["NAME"] == name)


# --- settings.PROVIDERS -------------------------------------------------------------------------

def test_real_mode_never_fills_a_missing_credential_with_a_built_in_one(settings):
    providers = build({**REAL_TWILIO, **REAL_REST, "SMS_PROVIDERS": "twilio,twilio_backup"}, "real")
    backup = entry(providers, "twilio_backup")
    assert backup["MODE"] == "real"
    assert backup["OPTIONS"]["ACCOUNT_SID"] == ""
    assert backup["OPTIONS"]["AUTH_TOKEN"] == ""
    assert backup["OPTIONS"]["BASE_URL"] is None
    settings.PROVIDER_MODE, settings.PROVIDERS = "real", providers
    assert check_providers_configured() == [
        'settings.PROVIDERS["sms"][1] "twilio_backup": TWILIO_BACKUP_ACCOUNT_SID, TWILIO_BACKUP_AUTH_TOKEN, '
        "TWILIO_BACKUP_FROM_NUMBER are not set (a provider in real mode needs its own credentials; the "
        "emulator's are only used with PROVIDER_MODE=emulator)"]


def test_real_mode_with_nothing_configured_names_every_variable(settings):
    providers = build({}, "real")
    assert {c: [e["NAME"] for e in entries] for c, entries in providers.items()} == {
        "sms": ["twilio"], "email": ["sendgrid"], "push": ["fcm"]}
    settings.PROVIDER_MODE, settings.PROVIDERS = "real", providers
    problems = check_providers_configured()
    assert [p.split(":")[1].split(" are not set")[0].strip() for p in problems] == [
        "TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN, TWILIO_FROM_NUMBER", "SENDGRID_API_KEY, EMAIL_FROM",
        "FCM_CREDENTIALS, FCM_PROJECT_ID"]


def test_a_built_in_secret_set_by_hand_is_refused_outside_emulator_mode(settings):
    providers = build({**REAL_TWILIO, **REAL_REST, "TWILIO_AUTH_TOKEN": EMULATOR_TOKEN}, "real")
    settings.PROVIDER_MODE, settings.PROVIDERS = "real", providers
    assert check_providers_configured() == [
        'settings.PROVIDERS["sms"][0] "twilio": TWILIO_AUTH_TOKEN is the emulator\'s public built-in credential, '
        "which only PROVIDER_MODE=emulator accepts"]
    settings.PROVIDER_MODE = "emulator"
    assert check_providers_configured() == []


def test_emulator_mode_with_zero_configuration_is_the_emulator_everywhere(settings):
    providers = build({}, "emulator")
    assert [(e["NAME"], e["MODE"]) for entries in providers.values() for e in entries] == [
        ("twilio", "emulator"), ("twilio_backup", "emulator"), ("sendgrid", "emulator"), ("smtp", "emulator"),
        ("fcm", "emulator")]
    assert entry(providers, "twilio_backup")["OPTIONS"]["AUTH_TOKEN"] == EMULATOR_TOKEN
    settings.PROVIDER_MODE, settings.PROVIDERS = "emulator", providers
    assert check_providers_configured() == []


def test_emulator_mode_makes_a_provider_real_only_with_its_own_account(settings):
    providers = build({"TWILIO_ACCOUNT_SID": REAL_TWILIO["TWILIO_ACCOUNT_SID"]}, "emulator")
    twilio = entry(providers, "twilio")
    assert (twilio["MODE"], twilio["OPTIONS"]["AUTH_TOKEN"], twilio["OPTIONS"]["BASE_URL"]) == ("real", "", None)
    assert [e["NAME"] for e in providers["sms"]] == ["twilio"]
    settings.PROVIDER_MODE, settings.PROVIDERS = "emulator", providers
    assert check_providers_configured()[0].startswith(
        'settings.PROVIDERS["sms"][0] "twilio": TWILIO_AUTH_TOKEN, TWILIO_FROM_NUMBER are not set')


def _check(extra_env: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_", "EMAIL_", "PROVIDER_MODE", "SMS_PROVIDERS"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "NOTIFY_ENV": "production", **extra_env})
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_manage_py_check_fails_at_start_up_for_a_backup_listed_without_its_credentials():
    config = {**REAL_TWILIO, **REAL_REST, "SMS_PROVIDERS": "twilio,twilio_backup"}
    refused = _check(config)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert ('settings.PROVIDERS["sms"][1] "twilio_backup": TWILIO_BACKUP_ACCOUNT_SID, TWILIO_BACKUP_AUTH_TOKEN, '
            "TWILIO_BACKUP_FROM_NUMBER are not set") in refused.stderr
    passed = _check({**config, "TWILIO_BACKUP_ACCOUNT_SID": "AC" + "b" * 32,
                     "TWILIO_BACKUP_AUTH_TOKEN": "real-backup-token", "TWILIO_BACKUP_FROM_NUMBER": "+14155550101"})
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "System check identified no issues" in passed.stdout


# --- the Twilio webhook -------------------------------------------------------------------------

def _forged_callback(account: str) -> tuple[int, Notification]:
    r = Recipient.objects.create(user_id=f"pm-{uuid.uuid4().hex[:8]}", phone="+4915112345678")
    n = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="sent",
                                    provider_message_id=f"SM{uuid.uuid4().hex}")
    path = f"/webhooks/twilio/status?nid={n.pk}"
    params = {"MessageSid": n.provider_message_id, "MessageStatus": "delivered", "AccountSid": account,
              "From": "+15005550007", "To": "+4915112345678"}
    signature = RequestValidator(EMULATOR_TOKEN).compute_signature("https://notify.example.org" + path, params)
    status = Client().post(path, data=params, headers={"X-Twilio-Signature": signature}).status_code
    n.refresh_from_db()
    return status, n


@pytest.mark.django_db
def test_a_callback_signed_with_the_emulator_token_is_refused_in_real_mode(settings):
    settings.PUBLIC_BASE_URL = "https://notify.example.org"
    settings.PROVIDER_MODE = "real"
    # What settings used to build for real Twilio with the backup's variables missing: the backup
    # account on the emulator's public token.
    primary = entry(build(REAL_TWILIO, "real"), "twilio")
    backup = {**primary, "NAME": "twilio_backup",
              "OPTIONS": {**primary["OPTIONS"], "ACCOUNT_SID": BACKUP_SID, "AUTH_TOKEN": EMULATOR_TOKEN}}
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [primary, backup]}
    status, n = _forged_callback(BACKUP_SID)
    assert (status, n.status, n.delivered_at) == (403, "sent", None)
    # As settings build it now: the backup has no token, the primary's does not match the forgery.
    settings.PROVIDERS = {**settings.PROVIDERS,
                          "sms": build({**REAL_TWILIO, "SMS_PROVIDERS": "twilio,twilio_backup"}, "real")["sms"]}
    status, n = _forged_callback(BACKUP_SID)
    assert (status, n.status) == (403, "sent")


@pytest.mark.django_db
def test_the_emulator_token_still_signs_callbacks_in_emulator_mode(settings):
    settings.PUBLIC_BASE_URL = "https://notify.example.org"
    settings.PROVIDER_MODE = "emulator"
    settings.PROVIDERS = build({}, "emulator")
    status, n = _forged_callback(BACKUP_SID)
    assert (status, n.status) == (204, "delivered")


# --- manage.py doctor ---------------------------------------------------------------------------

@pytest.mark.django_db
def test_doctor_fails_a_real_backup_account_without_its_variables(settings, monkeypatch):
    for name, value in REAL_TWILIO.items():
        monkeypatch.setenv(name, value)
    for name in ("TWILIO_BACKUP_ACCOUNT_SID", "TWILIO_BACKUP_AUTH_TOKEN", "TWILIO_BACKUP_FROM_NUMBER"):
        monkeypatch.delenv(name, raising=False)
    settings.PUBLIC_BASE_URL = "https://notify.example.org"
    real = {"BACKEND": "providers.twilio.backend.TwilioSmsBackend", "OPTIONS": {
        "ACCOUNT_SID": REAL_TWILIO["TWILIO_ACCOUNT_SID"], "AUTH_TOKEN": "real-primary-token",
        "FROM_NUMBER": "+14155550100", "BASE_URL": None}}
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [{**real, "NAME": "twilio"}, {**real, "NAME": "twilio_backup"}]}
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("doctor", "--skip", "workers", stdout=out)
    assert exited.value.code == 1
    assert ("FAIL  providers: sms: twilio_backup is configured for real use but TWILIO_BACKUP_ACCOUNT_SID, "
            "TWILIO_BACKUP_AUTH_TOKEN, TWILIO_BACKUP_FROM_NUMBER are not set") in out.getvalue()


def test_emulator_mode_reaches_every_provider_at_the_emulators_address():
    """A worker on a second host reaches the emulator over the network (tests/test_e2e_two_hosts.py):
    the SMTP sink is where EMULATOR_URL says, not the worker's own loopback (it was 127.0.0.1)."""
    providers = build_providers({}, "emulator", emulator_url="http://10.231.0.1:8900", emulator_smtp_port=8925,
                                public_base_url="http://10.231.0.1:8000", timeout=10.0)
    assert entry(providers, "smtp")["OPTIONS"]["HOST"] == "10.231.0.1"
    assert entry(providers, "smtp")["OPTIONS"]["PORT"] == 8925
    assert entry(providers, "sendgrid")["OPTIONS"]["HOST"] == "http://10.231.0.1:8900"
    assert entry(providers, "twilio")["OPTIONS"]["BASE_URL"] == "http://10.231.0.1:8900"
    assert entry(providers, "fcm")["OPTIONS"]["TOKEN_URI"] == "http://10.231.0.1:8900/token"
    # A real SMTP host is never replaced.
    real_smtp = build_providers({"SMTP_HOST": "smtp.example.org", "SMTP_PORT": "587", "EMAIL_FROM": "a@example.org"},
                                "emulator", emulator_url="http://10.231.0.1:8900", emulator_smtp_port=8925,
                                public_base_url="http://10.231.0.1:8000", timeout=10.0)
    assert entry(real_smtp, "smtp")["OPTIONS"]["HOST"] == "smtp.example.org"

"""``manage.py check --deploy`` is clean in a production configuration (issue 11 #7): HTTPS redirect,
HSTS and secure cookies are on outside local development, each from the environment; a checkout
(``NOTIFY_ENV=local`` in ``.run/env``) keeps plain HTTP."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from bench.stack import ROOT

PRODUCTION = {
    "NOTIFY_ENV": "production",
    "SECRET_KEY": secrets.token_urlsafe(48),
    "ALLOWED_HOSTS": "notify.example.org",
    "PUBLIC_BASE_URL": "https://notify.example.org",
    "TRUST_X_FORWARDED_PROTO": "1",
    "METRICS_TOKEN": secrets.token_urlsafe(32),
    "TWILIO_ACCOUNT_SID": "AC" + "a" * 32, "TWILIO_AUTH_TOKEN": "real-token", "TWILIO_FROM_NUMBER": "+14155550100",
    "SENDGRID_API_KEY": "SG.real-key", "EMAIL_FROM": "notify@example.org",
    "FCM_CREDENTIALS": "/etc/notify/fcm.json", "FCM_PROJECT_ID": "notify-prod",
}
_OURS = ("NOTIFY_ENV", "PROVIDER_MODE", "SECURE_", "SESSION_COOKIE", "CSRF_COOKIE", "METRICS_TOKEN", "TWILIO_",
         "SENDGRID_", "FCM_", "SMTP_", "EMAIL_", "SMS_PROVIDERS", "ALLOWED_HOSTS", "DEBUG", "TRUST_X", "WEBHOOKS_")


def manage(*args: str, **env_values: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", **env_values})
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_check_deploy_is_clean_in_a_production_configuration():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced)."


def test_check_deploy_names_a_missing_metrics_token():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **{**PRODUCTION, "METRICS_TOKEN": ""})
    assert result.returncode == 1
    assert ("(notifications.W001) METRICS_TOKEN is not set: outside local development /metrics refuses every "
            "request") in result.stderr


def test_production_defaults_and_local_development(settings):
    code = ("from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
            "s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
            "s.SECURE_PROXY_SSL_HEADER, s.LOCAL_DEVELOPMENT, s.PROVIDER_MODE)")
    production = manage("shell", "-v", "0", "-c", code, **PRODUCTION)
    assert production.stdout.split() == ["True", "31536000", "True", "True", "True", "True",
                                         "('HTTP_X_FORWARDED_PROTO',", "'https')", "False", "real"], production.stderr
    shorter = manage("shell", "-v", "0", "-c", code, **{**PRODUCTION, "SECURE_HSTS_SECONDS": "3600",
                                             "SECURE_HSTS_PRELOAD": "0", "SECURE_SSL_REDIRECT": "0"})
    assert shorter.stdout.split()[:4] == ["False", "3600", "True", "False"], shorter.stderr
    # This checkout (the tests' own settings): plain HTTP, as `make run` serves it.
    assert settings.LOCAL_DEVELOPMENT is True
    assert (settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS, settings.SESSION_COOKIE_SECURE,
            settings.CSRF_COOKIE_SECURE) == (False, 0, False, False)


def test_the_https_redirect_spares_the_probes_and_metrics(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    redirected = client.get("/admin/login/")
    assert redirected.status_code == 301 and redirected["Location"] == "https://testserver/admin/login/"
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code in (200, 401, 403)  # never a redirect


# --- issue 12 #6: what check --deploy used to let through ------------------------------------------

def test_check_deploy_warns_of_emulator_mode_outside_local_development():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **{**PRODUCTION, "PROVIDER_MODE": "emulator"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("(providers.W001) PROVIDER_MODE=emulator outside local development (NOTIFY_ENV=production)"
            in result.stderr), result.stderr


def test_status_webhooks_are_https_to_public_addresses_outside_local_development():
    """WEBHOOKS_ALLOW_INSECURE is off by default in production; turned on there, check --deploy names it."""
    code = "from django.conf import settings as s; print(s.WEBHOOKS['ALLOW_INSECURE'])"
    assert manage("shell", "-v", "0", "-c", code, **PRODUCTION).stdout.split() == ["False"]
    result = manage("check", "--deploy", "--fail-level", "WARNING", **{**PRODUCTION, "WEBHOOKS_ALLOW_INSECURE": "1"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(notifications.W003) WEBHOOKS_ALLOW_INSECURE is on outside local development" in result.stderr


def test_check_deploy_warns_of_a_short_metrics_token():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **{**PRODUCTION, "METRICS_TOKEN": "a"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "(notifications.W002) METRICS_TOKEN is 1 character long; use at least 32" in result.stderr
    ok = manage("check", "--deploy", "--fail-level", "WARNING", **{**PRODUCTION, "METRICS_TOKEN": "x" * 32})
    assert ok.returncode == 0, ok.stdout + ok.stderr


WITHOUT_PUSH = {k: v for k, v in PRODUCTION.items() if not k.startswith("FCM_")}


def test_a_deployment_without_push_passes_check_with_an_empty_push_list():
    missing = manage("check", **WITHOUT_PUSH)
    assert missing.returncode == 1  # forgotten credentials still fail, naming them
    assert "FCM_CREDENTIALS, FCM_PROJECT_ID are not set" in missing.stderr
    assert "PUSH_PROVIDERS= (empty)" in missing.stderr  # …and say how to run without push
    without = manage("check", "--deploy", "--fail-level", "WARNING", **{**WITHOUT_PUSH, "PUSH_PROVIDERS": ""})
    assert without.returncode == 0, without.stdout + without.stderr
    code = "from django.conf import settings as s; print({c: [e['NAME'] for e in s.PROVIDERS[c]] for c in s.PROVIDERS})"
    shown = manage("shell", "-v", "0", "-c", code, **{**WITHOUT_PUSH, "PUSH_PROVIDERS": ""})
    assert shown.stdout.strip() == "{'sms': ['twilio'], 'email': ['sendgrid'], 'push': []}", shown.stderr

"""providers.registry: building, caching and checking backends from settings.PROVIDERS."""

from __future__ import annotations

import gc
import logging
import threading
import uuid

import pytest
from celery import signals
from django.test import override_settings

from providers import registry
from providers.base import OutboundMessage, ProviderConfigurationError
from providers.sendgrid.backend import SendGridEmailBackend
from providers.smtp.backend import SmtpEmailBackend
from providers.twilio.backend import TwilioSmsBackend
from tests.providers.conftest import fcm_options, twilio_options

pytestmark = pytest.mark.timeout(30)

TWILIO = {"NAME": "twilio", "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
          "OPTIONS": {"ACCOUNT_SID": "AC1", "AUTH_TOKEN": "t", "FROM_NUMBER": "+15005550006",
                      "BASE_URL": "http://127.0.0.1:9"}}
SENDGRID = {"NAME": "sendgrid", "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
            "OPTIONS": {"API_KEY": "SG.x", "FROM_EMAIL": "n@example.com", "HOST": "http://127.0.0.1:9"}}
SMTP = {"NAME": "smtp", "BACKEND": "providers.smtp.backend.SmtpEmailBackend",
        "OPTIONS": {"HOST": "127.0.0.1", "PORT": 9, "FROM_EMAIL": "n@example.com"}}
FCM = {"NAME": "fcm", "BACKEND": "providers.fcm.backend.FcmPushBackend",
       "OPTIONS": {"PROJECT_ID": "p", "CREDENTIALS": None, "TOKEN_URI": "http://127.0.0.1:9/token",
                   "FCM_URL": "http://127.0.0.1:9/v1/projects/{0}/messages:send"}}
PROVIDERS = {"sms": [TWILIO], "email": [SENDGRID, SMTP], "push": [FCM]}


@pytest.fixture(autouse=True)
def _fresh_registry():
    registry.reset_backends()
    yield
    registry.reset_backends()


@override_settings(PROVIDERS=PROVIDERS)
def test_primary_and_named_backends():
    assert isinstance(registry.get_backend("sms"), TwilioSmsBackend)
    assert isinstance(registry.get_backend("email"), SendGridEmailBackend)
    assert isinstance(registry.get_backend("email", "smtp"), SmtpEmailBackend)
    assert registry.provider_names("email") == ["sendgrid", "smtp"]


@override_settings(PROVIDERS=PROVIDERS)
def test_one_instance_per_thread():
    mine = registry.get_backend("sms")
    other = []
    thread = threading.Thread(target=lambda: other.append(registry.get_backend("sms")))
    thread.start()
    thread.join()

    assert registry.get_backend("sms") is mine
    assert other[0] is not mine


@override_settings(PROVIDERS=PROVIDERS)
def test_reset_closes_and_rebuilds():
    first = registry.get_backend("sms")
    registry.reset_backends()

    assert first._client is None  # closed
    assert registry.get_backend("sms") is not first


@override_settings(PROVIDERS={"sms": []})
def test_missing_channel_names_the_setting():
    with pytest.raises(ProviderConfigurationError, match=r'settings.PROVIDERS\["sms"\]'):
        registry.get_backend("sms")
    with pytest.raises(ProviderConfigurationError, match=r'settings.PROVIDERS\["push"\]'):
        registry.get_backend("push")


@override_settings(PROVIDERS=PROVIDERS)
def test_unknown_name():
    with pytest.raises(ProviderConfigurationError, match='no provider named "mailgun"'):
        registry.get_backend("email", "mailgun")


@override_settings(PROVIDERS=PROVIDERS)
def test_check_passes_for_a_complete_configuration():
    assert registry.check_providers_configured() == []


@override_settings(PROVIDERS={
    "sms": [{"NAME": "twilio", "BACKEND": "providers.twilio.backend.TwilioSmsBackend", "OPTIONS": {}}],
    "email": [SENDGRID, {**SENDGRID}],
    "push": [{"NAME": "x", "BACKEND": "providers.nope.Backend"}],
    "fax": [],
})
def test_check_reports_every_problem():
    problems = registry.check_providers_configured()

    assert problems == [
        'settings.PROVIDERS["fax"]: unknown channel (expected one of sms, email, push)',
        'settings.PROVIDERS["sms"][0]: OPTIONS misses ACCOUNT_SID, AUTH_TOKEN, FROM_NUMBER',
        'settings.PROVIDERS["email"][1]: NAME "sendgrid" appears twice',
        'settings.PROVIDERS["push"][0]: BACKEND "providers.nope.Backend" cannot be imported '
        "(No module named 'providers.nope')",
    ]


@override_settings(PROVIDERS={"sms": [SENDGRID], "email": [SMTP], "push": [FCM]})
def test_check_reports_a_backend_on_the_wrong_channel():
    assert registry.check_providers_configured() == [
        'settings.PROVIDERS["sms"][0]: BACKEND providers.sendgrid.backend.SendGridEmailBackend serves '
        "channel 'email', not 'sms'",
    ]


@pytest.mark.parametrize("signal", ["worker_shutdown", "worker_process_shutdown"])
def test_a_worker_stop_closes_every_threads_provider_sessions_and_logs_no_unclosed_session(emu, caplog, signal):
    """Issue 23 #5: aiohttp logged ``ERROR Unclosed client session`` at every stop of a worker.
    Backends opened and used in pool threads (worker_high's), as a task opens them; then the
    shutdown signal a threaded worker (``worker_shutdown``) or a prefork pool process
    (``worker_process_shutdown``) sends, with config/celery.py's receivers connected."""
    import config.celery  # noqa: F401  (the app module connects the signal receivers)

    providers = {"sms": [{**TWILIO, "OPTIONS": twilio_options(emu)}],
                 "push": [{**FCM, "OPTIONS": fcm_options(emu)}]}
    sessions = []

    def task():
        sms, push = registry.get_backend("sms"), registry.get_backend("push")
        sms.send(OutboundMessage(notification_id=str(uuid.uuid4()), channel="sms", to="+15551230001", body="b"))
        push.send(OutboundMessage(notification_id=str(uuid.uuid4()), channel="push", to="device-token-1",
                                  title="t", body="b"))
        sessions.extend([sms._async_http.session, push._client.session])

    gc.collect()  # what earlier tests left unreachable is collected now, not during this test
    with override_settings(PROVIDERS=providers), caplog.at_level(logging.ERROR):
        threads = [threading.Thread(target=task) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(sessions) == 4 and not any(s.closed for s in sessions)
        ours = {f"{id(s):#x}" for s in sessions}

        getattr(signals, signal).send(sender=None, pid=None, exitcode=0)

        assert [s.closed for s in sessions] == [True] * 4
        sessions.clear()
        gc.collect()
    unclosed = [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]
    assert [m for m in unclosed if any(address in m for address in ours)] == []
    assert emu.count() == 4

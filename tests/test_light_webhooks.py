"""The provider webhooks' light path (config/light_webhooks.py): the web process's WSGI application
(``config.wsgi.application``) answers the Twilio and SendGrid callbacks without Django's handler.

Every test of tests/test_webhooks.py runs here again through that WSGI callable instead of Django's
test client (same payloads, signed with the SDK helpers; same assertions); the tests below add what
Django's handler used to answer around the views (405, 413, 503, other paths)."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest
from django.core.signals import request_started
from django.db import OperationalError
from django.test import RequestFactory

from config import light_webhooks
from core.api.errors import DATABASE_RETRY_AFTER
from tests import test_webhooks
from tests.test_webhooks import *  # noqa: F403 (each webhook test, run again through the light path)
from tests.test_webhooks import _public_url, make_notification, twilio_post  # noqa: F401

pytestmark = pytest.mark.django_db


class WsgiResponse:
    """What the tests read of a response: ``status_code``, ``json()``, headers by name."""

    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes):
        self.status_code = int(status.split()[0])
        self.headers = dict(headers)
        self.content = body

    def json(self):
        return json.loads(self.content)

    def __getitem__(self, name: str) -> str:
        return self.headers[name]


class WsgiClient:
    """Django's test client's ``post``/``get``, sent through ``config.wsgi.application`` (the request
    encoded as the test client encodes it: ``RequestFactory``)."""

    def _call(self, request) -> WsgiResponse:
        from config.wsgi import application

        started: list = []
        body = b"".join(application(request.environ, lambda status, headers: started.append((status, headers))))
        return WsgiResponse(*started[0], body)

    def post(self, path, data=None, content_type=None, **extra):
        kwargs = {"content_type": content_type} if content_type else {}
        return self._call(RequestFactory().post(path, data=data if data is not None else {}, **kwargs, **extra))

    def get(self, path, **extra):
        return self._call(RequestFactory().get(path, **extra))


@pytest.fixture(autouse=True)
def _through_the_light_path(monkeypatch):
    """Webhook requests go through the WSGI callable; its end-of-request connection check is off, as
    Django's test client turns it off (it would close the test's transaction's connection)."""
    monkeypatch.setattr(test_webhooks, "Client", WsgiClient)
    monkeypatch.setattr(light_webhooks, "close_old_connections", lambda: None)
    handled_by_django: list = []

    def count(**kwargs):
        handled_by_django.append(kwargs)

    request_started.connect(count)
    yield handled_by_django
    request_started.disconnect(count)


def test_webhooks_skip_django_handler_and_other_paths_do_not(_through_the_light_path):
    n = make_notification("sms")
    assert twilio_post(n, "delivered").status_code == 204
    assert _through_the_light_path == []  # no request_started: Django's handler never ran
    n.refresh_from_db()
    assert n.status == "delivered"
    r = WsgiClient().get("/v1/nothing-here")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    assert len(_through_the_light_path) == 1


def test_another_method_is_405():
    r = WsgiClient().get("/webhooks/twilio/status")
    assert r.status_code == 405
    assert r["Allow"] == "POST"


@pytest.mark.parametrize("path", ["/webhooks/twilio/status", "/webhooks/sendgrid/events"])
def test_a_body_over_the_limit_is_413_in_the_error_shape_and_stores_nothing(settings, sg_key, path):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    n = make_notification("sms")
    body = urlencode({"MessageSid": n.provider_message_id, "MessageStatus": "delivered", "pad": "x" * 1000})
    r = WsgiClient().post(path, data=body, content_type="application/x-www-form-urlencoded",
                          headers={"X-Twilio-Signature": "c2ln", "X-Twilio-Email-Event-Webhook-Signature": "c2ln",
                                   "X-Twilio-Email-Event-Webhook-Timestamp": str(int(time.time()))})
    assert r.status_code == 413
    error = r.json()["error"]
    assert (error["status"], error["code"]) == (413, "payload_too_large")
    assert "1,000 bytes" in error["message"]
    n.refresh_from_db()
    assert n.status == "sent" and not n.events.exists()


def test_a_broken_database_is_503_with_retry_after(monkeypatch):
    def broken(request):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setitem(light_webhooks.ROUTES, "/webhooks/twilio/status", broken)
    r = WsgiClient().post("/webhooks/twilio/status", data={"MessageStatus": "delivered"})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "database_unavailable"
    assert r["Retry-After"] == str(DATABASE_RETRY_AFTER)


def test_an_unexpected_error_is_500_in_the_error_shape_and_logged(monkeypatch, caplog):
    def failing(request):
        raise RuntimeError("boom")

    monkeypatch.setitem(light_webhooks.ROUTES, "/webhooks/sendgrid/events", failing)
    r = WsgiClient().post("/webhooks/sendgrid/events", data=b"[]", content_type="application/json")
    assert (r.status_code, r.json()["error"]["code"]) == (500, "server_error")
    assert any("provider webhook /webhooks/sendgrid/events failed" in m for m in caplog.messages)


def test_a_host_not_allowed_is_400_in_the_error_shape(settings):
    """Without ``PUBLIC_BASE_URL`` the signed URL is built from the request's Host, which must be allowed."""
    settings.PUBLIC_BASE_URL = ""
    settings.ALLOWED_HOSTS = ["notify.example.com"]
    n = make_notification("sms")
    r = WsgiClient().post(f"/webhooks/twilio/status?nid={n.pk}", data={"MessageStatus": "delivered"},
                          headers={"X-Twilio-Signature": "c2ln", "Host": "evil.example.com"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_request")
    n.refresh_from_db()
    assert n.status == "sent"

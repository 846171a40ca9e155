"""Abuse limits at acceptance (docs/POLICIES.md, "Abuse limits"), in-process: ``POST /v1/events``
and ``POST /v1/notifications`` (plain and typed) refuse the request over a limit with 429
``acceptance_limited``, ``Retry-After`` and the limit's name, and write nothing; replays are never
counted; concurrent requests never pass more than the limit; Redis down is 503. The rule itself
against a model of it: tests/test_acceptance_rules.py; with real workers: tests/test_e2e_acceptance_limits.py."""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client

from core.redis_client import get_redis
from notifications import metrics
from notifications.acceptance import rules
from notifications.acceptance.models import AcceptanceLimit
from notifications.events.models import Event, NotificationType, TypeTemplate
from notifications.models import APIAuditEntry, APIClient, DeliveryEvent, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_metrics import key, samples

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def http_for(name: str = "auth") -> tuple[APIClient, Client]:
    client, key = APIClient.objects.create_key(name=name, scopes=list(EVERY_SCOPE))
    return client, Client(headers={"Authorization": f"Api-Key {key}"})


def otp_type(key: str = "otp", channels=("sms",)) -> NotificationType:
    kind = NotificationType.objects.create(key=key, name="One-time code", category="security", priority="high",
                                           quiet_hours="bypass", channels=list(channels))
    for channel in channels:
        TypeTemplate.objects.create(type=kind, channel=channel, locale="en", body="Code {{ data.code }}",
                                    title="" if channel == "sms" else "Your code")
    return kind


def user(user_id: str, phone: str = "", email: str = "") -> Recipient:
    return Recipient.objects.create(user_id=user_id, phone=phone or f"+4915100{abs(hash(user_id)) % 10**6:06d}",
                                    email=email or f"{user_id}@example.org")


def post(http, path: str, body: dict, key: str):
    return http.post(path, data=json.dumps(body), content_type="application/json", headers={"Idempotency-Key": key})


def event(http, user_id: str, key: str, **extra):
    return post(http, "/v1/events", {"type": "otp", "user_id": user_id, "data": {"code": "123456"}, **extra}, key)


def typed(http, user_id: str, key: str):
    return post(http, "/v1/notifications", {"type": "otp", "user_id": user_id, "channel": "sms",
                                            "data": {"code": "123456"}}, key)


def counts() -> tuple[int, int, int, int]:
    """Rows of every kind an accepted send writes (the idempotency record is the row itself, keyed
    by ``(client, Idempotency-Key)``) and the audit log."""
    return (Notification.objects.count(), Event.objects.count(), DeliveryEvent.objects.count(),
            APIAuditEntry.objects.count())


def limited_total(limit: str) -> float:
    """``notify_acceptance_limited_total{limit}`` as ``/metrics`` shows it."""
    found = samples(Client().get("/metrics").content.decode())
    return found.get(key("notify_acceptance_limited_total", limit=limit), 0.0)


@pytest.fixture(autouse=True)
def _metrics(tmp_path, settings):
    """A private multiprocess directory; /metrics open to local requests."""
    settings.METRICS_TOKEN = ""
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    metrics.use_multiprocess_dir(str(tmp_path / "prometheus"))
    yield
    metrics.use_multiprocess_dir(previous)


@pytest.fixture
def auth(frozen):
    otp_type()
    return http_for()


def test_the_sixth_otp_in_ten_minutes_is_429_naming_the_limit_and_nothing_is_written(auth, frozen, caplog):
    client, http = auth
    user("alice")
    user("bob")
    for i in range(5):
        frozen[0] = NOW + timedelta(seconds=60 * i)
        assert event(http, "alice", f"k{i}").status_code == 202
    frozen[0] = NOW + timedelta(seconds=300)
    before = counts()
    with caplog.at_level(logging.WARNING, logger="notifications.acceptance.rules"):
        resp = event(http, "alice", "k5")
    assert resp.status_code == 429, resp.content
    # The oldest of the five (at NOW) leaves the window at NOW + 600 s: 300 s from now.
    assert resp["Retry-After"] == "300"
    error = resp.json()["error"]
    assert (error["code"], error["limit"], error["retry_after"], error["status"]) == (
        "acceptance_limited", "otp_per_user", 300, 429)
    assert error["fields"] == [{"field": "user_id", "code": "acceptance_limited", "message": error["message"][9:]}]
    assert "'alice'" in error["message"] and "at most 5 of type otp per user in 600 s" in error["message"]
    assert counts() == before
    assert not Event.objects.filter(idempotency_key="k5").exists()
    assert [r.getMessage() for r in caplog.records if r.name == "notifications.acceptance.rules"] == [
        f"acceptance limited: user_id=alice limit=otp_per_user client={client.name} retry_after=300s"]
    assert limited_total("otp_per_user") == 1.0
    # Another user is unaffected; the same user is let through once a slot frees, not before.
    assert event(http, "bob", "b0").status_code == 202
    frozen[0] = NOW + timedelta(seconds=599)
    assert event(http, "alice", "k6").status_code == 429
    frozen[0] = NOW + timedelta(seconds=600)
    assert event(http, "alice", "k7").status_code == 202


def test_typed_single_sends_and_events_count_in_one_window(auth, frozen):
    _, http = auth
    user("alice")
    for i in range(3):
        assert event(http, "alice", f"e{i}").status_code == 202
    for i in range(2):
        assert typed(http, "alice", f"t{i}").status_code == 202
    before = counts()
    resp = typed(http, "alice", "t2")
    assert (resp.status_code, resp.json()["error"]["limit"], resp["Retry-After"]) == (429, "otp_per_user", "600")
    assert counts() == before


def test_plain_sends_are_limited_by_a_category_rule_from_the_admin(auth, frozen):
    _, http = auth
    user("alice")
    AcceptanceLimit.objects.create(name="security_sms_per_user", category="security", per="user", limit=2,
                                   window_seconds=60)
    body = {"user_id": "alice", "channel": "sms", "category": "security", "content": {"body": "Code 1"}}
    assert [post(http, "/v1/notifications", body, f"p{i}").status_code for i in range(3)] == [202, 202, 429]
    # Another category is not counted by it.
    other = {**body, "category": "account"}
    assert post(http, "/v1/notifications", other, "p9").status_code == 202
    assert Notification.objects.filter(recipient_id="alice").count() == 3


def test_an_admin_row_replaces_the_settings_rule_of_its_name_or_switches_it_off(auth, frozen):
    _, http = auth
    user("alice")
    AcceptanceLimit.objects.create(name="otp_per_user", type_key="otp", per="user", limit=2, window_seconds=60)
    assert [event(http, "alice", f"k{i}").status_code for i in range(3)] == [202, 202, 429]
    AcceptanceLimit.objects.filter(pk="otp_per_user").update(enabled=False)
    assert [r.name for r in rules.effective_rules()] == ["otp_per_phone"]
    assert [event(http, "alice", f"j{i}").status_code for i in range(4)] == [202] * 4


def test_per_phone_counts_across_users(auth, frozen):
    _, http = auth
    shared = "+491510000001"
    for name in ("mum", "dad", "kid"):
        user(name, phone=shared)
    user("other", phone="+491510000002")
    sent = [("mum", 4), ("dad", 4), ("kid", 2)]
    for name, n in sent:
        for i in range(n):
            assert event(http, name, f"{name}{i}").status_code == 202
    before = counts()
    resp = event(http, "kid", "kid9")
    error = resp.json()["error"]
    assert (resp.status_code, error["limit"], resp["Retry-After"]) == (429, "otp_per_phone", "600")
    assert "'kid'" in error["message"] and "at most 10 of type otp per phone" in error["message"]
    assert counts() == before
    assert event(http, "other", "o0").status_code == 202


def test_per_phone_counts_only_requests_that_would_send_an_sms(auth, frozen):
    _, http = auth
    otp_type("otp_mail", channels=("email",))
    AcceptanceLimit.objects.create(name="mail_otp_per_phone", type_key="otp_mail", per="phone", limit=1,
                                   window_seconds=600)
    user("alice")
    body = {"type": "otp_mail", "user_id": "alice", "data": {"code": "1"}}
    assert [post(http, "/v1/events", body, f"m{i}").status_code for i in range(3)] == [202] * 3


def test_an_idempotent_replay_is_answered_as_before_and_never_counted(auth, frozen):
    _, http = auth
    user("alice")
    first = [event(http, "alice", f"k{i}") for i in range(5)]
    assert [r.status_code for r in first] == [202] * 5
    replay = event(http, "alice", "k0")
    assert (replay.status_code, replay["Idempotent-Replayed"], replay.json()) == (202, "true", first[0].json())
    assert event(http, "alice", "k5").status_code == 429
    # Over the limit, replays of accepted requests are still answered; a reused key is still 422.
    assert event(http, "alice", "k4").json() == first[4].json()
    assert event(http, "alice", "k3", data={"code": "other"}).status_code == 422
    assert get_redis().zcard("acceptance:otp_per_user:user:alice") == 5


def test_an_event_for_many_users_is_refused_whole_naming_the_first_limited_user(auth, frozen):
    _, http = auth
    for name in ("u0", "u1", "u2"):
        user(name)
    for i in range(5):
        assert event(http, "u1", f"k{i}").status_code == 202
    before = counts()
    resp = post(http, "/v1/events", {"type": "otp", "user_ids": ["u0", "u1", "u2"], "data": {"code": "1"}}, "all")
    assert resp.status_code == 429 and "'u1'" in resp.json()["error"]["message"]
    assert [(f["field"], f["code"]) for f in resp.json()["error"]["fields"]] == [("user_ids.1", "acceptance_limited")]
    assert counts() == before
    # The refused request took no slot of u0 or u2.
    assert [event(http, "u0", f"z{i}").status_code for i in range(6)] == [202] * 5 + [429]


def test_redis_down_is_503_for_a_limited_request_and_other_sends_go_on(auth, frozen, settings):
    _, http = auth
    user("alice")
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: connection refused
    before = counts()
    resp = event(http, "alice", "k0")
    assert (resp.status_code, resp.json()["error"]["code"]) == (503, "acceptance_limits_unavailable")
    assert counts()[:3] == before[:3]
    plain = {"user_id": "alice", "channel": "sms", "content": {"body": "hello"}}
    assert post(http, "/v1/notifications", plain, "plain").status_code == 202


def test_a_failed_write_gives_its_slots_back(auth, frozen, monkeypatch):
    from notifications.events import services

    client, _ = auth
    alice = user("alice")
    kind = NotificationType.objects.get(pk="otp")

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(DeliveryEvent.objects, "bulk_create", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        services.accept_event(client=client, idempotency_key="k", fingerprint="f", kind=kind, recipients=[alice],
                              data={})
    assert get_redis().zcard("acceptance:otp_per_user:user:alice") == 0
    assert Event.objects.count() == 0


def test_settings_rules_are_checked(settings):
    settings.NOTIFY = {**settings.NOTIFY, "ACCEPTANCE_LIMITS": [
        {"name": "x", "match": {}, "per": "user", "limit": 1, "window_seconds": 60}]}
    with pytest.raises(ImproperlyConfigured, match=r"\(x\): match needs a type, a category or both"):
        rules.settings_rules()
    settings.NOTIFY = {**settings.NOTIFY, "ACCEPTANCE_LIMITS": [
        {"name": "y", "match": {"type": "otp"}, "per": "device", "limit": 1, "window_seconds": 60}]}
    with pytest.raises(ImproperlyConfigured, match="per must be user, phone or email"):
        rules.settings_rules()


def test_the_admin_lists_the_limits_in_force(admin_client, fast_password_hashing):
    AcceptanceLimit.objects.create(name="otp_per_user", type_key="otp", per="user", limit=3, window_seconds=300)
    AcceptanceLimit.objects.create(name="login_mail", category="security", per="email", limit=20,
                                   window_seconds=3600)
    page = admin_client.get("/admin/notifications/acceptancelimit/")
    assert page.status_code == 200
    assert [(r.name, r.limit, r.source) for r in page.context["effective_rules"]] == [
        ("otp_per_user", 3, "admin"), ("otp_per_phone", 10, "settings"), ("login_mail", 20, "admin")]
    assert b'class="limit-otp_per_phone"' in page.content
    bad = admin_client.post("/admin/notifications/acceptancelimit/add/", {
        "name": "nothing", "type_key": "", "category": "", "per": "user", "limit": 1, "window_seconds": 60,
        "enabled": "on"})
    assert bad.status_code == 200 and "give a type key, a category, or both" in bad.content.decode()
    assert not AcceptanceLimit.objects.filter(pk="nothing").exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_never_accept_more_than_the_limit():
    otp_type()
    client, key = APIClient.objects.create_key(name="auth", scopes=list(EVERY_SCOPE))
    user("alice")
    statuses: list[int] = []
    start = threading.Barrier(12)

    def one(idem: str) -> None:
        try:
            http = Client(headers={"Authorization": f"Api-Key {key}"})
            start.wait()
            statuses.append(event(http, "alice", idem).status_code)
        finally:
            connection.close()

    # Eight distinct requests and four copies of one more, all at once.
    threads = [threading.Thread(target=one, args=(f"k{i}",)) for i in range(8)]
    threads += [threading.Thread(target=one, args=("dup",)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = Event.objects.filter(client=client).count()
    assert accepted == 5
    assert get_redis().zcard("acceptance:otp_per_user:user:alice") == 5
    # 202s are the 5 accepted requests plus any replays of "dup" among them; the rest are 429.
    dup_accepted = Event.objects.filter(client=client, idempotency_key="dup").exists()
    assert statuses.count(202) == (5 - dup_accepted) + (4 if dup_accepted else 0)
    assert statuses.count(429) == 12 - statuses.count(202)

"""``POST /v1/events`` and its reads: acceptance into one notification per user and channel with
derived ids, idempotency, fallback waits, bad input (a 4xx naming the field, nothing written),
tenancy; and the typed form of ``POST /v1/notifications`` (docs/TYPES.md).

In-process (Django test client, rolled-back transactions): acceptance and bookkeeping, not delivery
(tests/test_e2e_events.py sends with real workers)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from notifications.events.models import Event, NotificationType, TypeTemplate
from notifications.ids import EVENT_ID_NAMESPACE, EVENT_NOTIFICATION_NAMESPACE
from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db


def http_for(name: str, scopes=EVERY_SCOPE) -> tuple[APIClient, Client]:
    client, key = APIClient.objects.create_key(name=name, scopes=list(scopes))
    return client, Client(headers={"Authorization": f"Api-Key {key}"})


def make_type(key="order_shipped", channels=("push", "email", "sms"), routing="all", **over) -> NotificationType:
    kind = NotificationType.objects.create(key=key, name=key, category=over.pop("category", "shipping"),
                                           channels=list(channels), routing=routing, **over)
    for channel in channels:
        TypeTemplate.objects.create(type=kind, channel=channel, locale="en", body="Order {{ data.order_id }}",
                                    title="Shipped" if channel != "sms" else "")
    return kind


@pytest.fixture
def owner():
    return http_for("orders")


@pytest.fixture
def users():
    return [Recipient.objects.create(user_id=f"u{i}", email=f"u{i}@example.org", phone=f"+1555000{i:04d}")
            for i in range(3)]


def post(http, body, key="order-8812:shipped", path="/v1/events"):
    headers = {"Idempotency-Key": key} if key else {}
    return http.post(path, data=json.dumps(body), content_type="application/json", headers=headers)


def fields(resp) -> dict:
    return {f["field"]: f["code"] for f in resp.json()["error"]["fields"]}


def assert_nothing_written():
    assert (Event.objects.count(), Notification.objects.count(), DeliveryEvent.objects.count()) == (0, 0, 0)


def test_an_event_becomes_one_notification_per_user_and_channel_with_derived_ids(owner, users):
    client, http = owner
    make_type()
    resp = post(http, {"type": "order_shipped", "user_ids": ["u0", "u1"], "data": {"order_id": "8812"}})
    assert resp.status_code == 202, resp.content
    body = resp.json()
    eid = uuid.uuid5(EVENT_ID_NAMESPACE, f"{client.pk}:order-8812:shipped")
    assert body["id"] == str(eid) and resp["Location"] == f"/v1/events/{eid}"
    assert [(n["user_id"], n["channel"], n["status"]) for n in body["notifications"]] == [
        (u, c, "scheduled") for u in ("u0", "u1") for c in ("push", "email", "sms")]
    assert [n["id"] for n in body["notifications"]] == [
        str(uuid.uuid5(EVENT_NOTIFICATION_NAMESPACE, f"{eid}:{u}:{c}")) for u in ("u0", "u1")
        for c in ("push", "email", "sms")]
    rows = Notification.objects.filter(event_id=eid)
    # Standard rows due now wait for the scheduler, which releases them in batches within a second.
    assert set(rows.values_list("status", "notification_type_id", "category", "priority", "body")) == {
        ("scheduled", "order_shipped", "shipping", "standard", "")}
    assert all(due is not None for due in rows.values_list("due_at", flat=True))
    assert Event.objects.get(pk=eid).data == {"order_id": "8812"}

    again = post(http, {"type": "order_shipped", "user_ids": ["u0", "u1"], "data": {"order_id": "8812"}})
    assert (again.status_code, again.json(), again["Idempotent-Replayed"]) == (202, body, "true")
    other = post(http, {"type": "order_shipped", "user_ids": ["u0"], "data": {"order_id": "8812"}})
    assert (other.status_code, fields(other)) == (422, {"Idempotency-Key": "idempotency_key_reused"})
    assert (Event.objects.count(), Notification.objects.count()) == (1, 6)


def test_fallback_routing_makes_the_first_channel_due_and_the_next_ones_wait_in_order(owner, users):
    _client, http = owner
    make_type(routing="fallback")
    body = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"order_id": "1"}}).json()
    assert [(n["channel"], n["status"], n["reason"]) for n in body["notifications"]] == [
        ("push", "scheduled", ""), ("email", "scheduled", "fallback_waiting"), ("sms", "scheduled", "fallback_waiting")]
    push, email, sms = (Notification.objects.get(pk=n["id"]) for n in body["notifications"])
    assert (email.fallback_after, sms.fallback_after, push.fallback_after) == (push.pk, email.pk, None)
    assert email.due_at is None and sms.due_at is None


@pytest.mark.parametrize(("body", "field", "code"), [
    ({"type": "nope", "user_id": "u0"}, "type", "unknown_type"),
    ({"type": "order_shipped", "user_id": "u0", "data": ["x"]}, "data", "invalid_type"),
    ({"type": "order_shipped", "user_id": "u0", "data": {"blob": "x" * 17000}}, "data", "payload_too_large"),
    ({"type": "order_shipped"}, "user_id", "required"),
    ({"type": "order_shipped", "user_id": "u0", "user_ids": ["u1"]}, "user_id", "exclusive"),
    ({"type": "order_shipped", "user_ids": ["u0", "u1", "u0"]}, "user_ids.2", "duplicate"),
    ({"type": "order_shipped", "user_ids": [f"x{i}" for i in range(1001)]}, "user_ids", "max_length"),
    ({"type": "order_shipped", "user_ids": []}, "user_ids", "min_length"),
    ({"type": "order_shipped", "user_ids": ["u0", "ghost"]}, "user_ids.1", "unknown_user"),
    ({"type": "order_shipped", "user_id": "ghost"}, "user_id", "unknown_user"),
    ({"type": "order_shipped", "user_id": "u0", "ttl_seconds": 0}, "ttl_seconds", "min_value"),
    ({"type": "order_shipped", "user_id": "u0", "scheduled_at": "2026-12-24T10:00:00"}, "scheduled_at",
     "naive_datetime"),
    ({"type": "order_shipped", "user_id": "u0", "colour": "red"}, "colour", "unknown_field"),
    ({"type": "order_shipped", "user_id": "u0", "collapse_key": "a\u0085b"}, "collapse_key", "invalid"),
])
def test_bad_input_names_the_field_and_the_rule_and_writes_nothing(owner, users, body, field, code):
    _client, http = owner
    make_type()
    resp = post(http, body)
    assert resp.status_code in (400, 422), resp.content
    assert fields(resp).get(field) == code, resp.json()
    assert_nothing_written()


def test_a_variable_the_type_requires_must_be_in_the_data(owner, users):
    _client, http = owner
    make_type(required_data=["tracking_url", "order_id"])
    resp = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"order_id": "1", "tracking_url": ""}})
    assert (resp.status_code, fields(resp)) == (422, {"data.tracking_url": "required"})
    assert_nothing_written()


def test_a_high_type_needs_the_high_scope_and_another_clients_type_is_refused(owner, users):
    _client, http = owner
    make_type("otp", channels=("sms",), category="security", priority="high", quiet_hours="bypass")
    _low, low = http_for("low", ["notifications:send", "read"])
    resp = post(low, {"type": "otp", "user_id": "u0"})
    assert (resp.status_code, fields(resp)) == (403, {"type": "missing_scope"})
    stranger, _http = http_for("stranger")
    make_type("their_type", client=stranger)
    resp = post(http, {"type": "their_type", "user_id": "u0"})
    assert (resp.status_code, fields(resp)) == (403, {"type": "not_owner"})
    assert_nothing_written()


def test_the_event_reads_with_its_notifications_and_only_by_its_client(owner, users):
    _client, http = owner
    make_type(sensitive=True)
    eid = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"order_id": "1"}}).json()["id"]
    body = http.get(f"/v1/events/{eid}").json()
    assert (body["type"], body["data"], body["recipients"][0]["user_id"], body["recipients"][0]["outcome"]) == (
        "order_shipped", None, "u0", "pending")
    assert [(n["channel"], n["status"], [t["kind"] for t in n["timeline"]])
            for n in body["recipients"][0]["notifications"]] == [
        ("push", "scheduled", ["accepted"]), ("email", "scheduled", ["accepted"]), ("sms", "scheduled", ["accepted"])]
    _other, stranger = http_for("stranger")
    assert stranger.get(f"/v1/events/{eid}").status_code == 404
    assert stranger.post(f"/v1/events/{eid}/cancel").status_code == 404


def test_cancel_cancels_what_is_not_claimed_and_a_second_cancel_is_a_conflict(owner, users):
    _client, http = owner
    make_type(routing="fallback")
    eid = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"order_id": "1"}}).json()["id"]
    resp = http.post(f"/v1/events/{eid}/cancel")
    assert resp.status_code == 200, resp.content
    assert sorted(Notification.objects.filter(event_id=eid).values_list("status", "reason")) == [
        ("cancelled", "cancelled_by_client")] * 3
    assert resp.json()["cancelled_at"] is not None and resp.json()["recipients"][0]["outcome"] == "not_reached"
    assert http.post(f"/v1/events/{eid}/cancel").status_code == 409


def test_a_typed_single_send_renders_from_the_type_and_shares_the_key_rule(owner, users):
    _client, http = owner
    make_type()
    body = {"user_id": "u0", "channel": "email", "type": "order_shipped", "data": {"order_id": "7"}}
    resp = post(http, body, key="typed-1", path="/v1/notifications")
    assert resp.status_code == 202, resp.content
    n = Notification.objects.get(pk=resp.json()["id"])
    assert (n.channel, n.notification_type_id, n.event.data, n.idempotency_key, n.body) == (
        "email", "order_shipped", {"order_id": "7"}, "typed-1", "")
    assert post(http, body, key="typed-1", path="/v1/notifications").json() == resp.json()
    untyped = {"user_id": "u0", "channel": "sms", "content": {"body": "hi"}}
    assert fields(post(http, untyped, key="typed-1", path="/v1/notifications")) == {
        "Idempotency-Key": "idempotency_key_reused"}
    assert post(http, untyped, key="plain-1", path="/v1/notifications").status_code == 202
    assert fields(post(http, body, key="plain-1", path="/v1/notifications")) == {
        "Idempotency-Key": "idempotency_key_reused"}
    assert Notification.objects.count() == 2


@pytest.mark.parametrize(("change", "field", "code"), [
    ({"content": {"body": "x"}}, "content", "not_allowed_with_type"),
    ({"category": "shipping"}, "category", "not_allowed_with_type"),
    ({"channel": "sms", "type": "email_only"}, "channel", "not_in_type"),
    ({"type": "nope"}, "type", "unknown_type"),
])
def test_a_typed_single_send_refuses_what_the_type_decides(owner, users, change, field, code):
    _client, http = owner
    make_type("email_only", channels=("email",))
    body = {"user_id": "u0", "channel": "email", "type": "email_only", "data": {}, **change}
    resp = post(http, body, key="typed-2", path="/v1/notifications")
    assert resp.status_code == 422 and fields(resp).get(field) == code, resp.json()
    assert_nothing_written()


user_lists = st.lists(st.sampled_from(["u0", "u1", "u2", "ghost", "", "a\u0000"]), min_size=0, max_size=5)
datas = st.one_of(st.dictionaries(st.sampled_from(["order_id", "tracking_url", "x"]),
                                  st.one_of(st.text(max_size=5), st.integers(), st.none()), max_size=3),
                  st.lists(st.integers(), max_size=2), st.text(max_size=3), st.none())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(users_given="u0", data={"x": "a\x00"}, ttl=None, required=False, routing="all")  # a NUL Hypothesis found
@given(users_given=st.one_of(st.none(), user_lists, st.sampled_from(["u0", "ghost", ""])), data=datas,
       ttl=st.one_of(st.none(), st.integers(-5, 3_000_000)), required=st.booleans(), routing=st.sampled_from(
           ["all", "fallback"]))
def test_generated_events_are_accepted_whole_or_refused_naming_a_field_with_nothing_written(
        owner, users, users_given, data, ttl, required, routing):
    _client, http = owner
    if not NotificationType.objects.filter(pk="order_shipped").exists():
        make_type()
    NotificationType.objects.filter(pk="order_shipped").update(routing=routing,
                                                               required_data=["order_id"] if required else [])
    body = {"type": "order_shipped", "data": data}
    if isinstance(users_given, list):
        body["user_ids"] = users_given
    elif users_given is not None:
        body["user_id"] = users_given
    if ttl is not None:
        body["ttl_seconds"] = ttl
    before = (Event.objects.count(), Notification.objects.count())
    resp = post(http, body, key=uuid.uuid4().hex)
    wanted = users_given if isinstance(users_given, list) else [users_given]
    valid = (users_given is not None and wanted and all(u in ("u0", "u1", "u2") for u in wanted)
             and len(set(wanted)) == len(wanted) and (data is None or isinstance(data, dict))
             and (ttl is None or 1 <= ttl <= 28 * 24 * 3600)
             and (not required or (isinstance(data, dict) and data.get("order_id") not in (None, ""))))
    if data is None:
        valid = False  # null is not an object
    if "\\u0000" in json.dumps(data):
        valid = False  # Postgres stores no NUL: 400 unstorable_character naming the key
    if valid:
        assert resp.status_code == 202, resp.content
        assert Notification.objects.count() - before[1] == 3 * len(wanted)
    else:
        assert resp.status_code in (400, 422), resp.content
        assert resp.json()["error"]["fields"] and all(f["field"] for f in resp.json()["error"]["fields"])
        assert (Event.objects.count(), Notification.objects.count()) == before


def test_erasure_removes_the_data_of_the_users_own_events_and_keeps_shared_ones(owner, users):
    """Adversarial finding (issue 14): an erased user's event kept its data (an address)."""
    from preferences.api.erasure import erase_user

    _client, http = owner
    make_type()
    own = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"address": "Hauptstr. 1"}}, key="a").json()
    shared = post(http, {"type": "order_shipped", "user_ids": ["u0", "u1"], "data": {"sale": "20%"}}, key="b").json()
    erase_user(Recipient.objects.get(pk="u0"), requested_by="test")
    assert Event.objects.get(pk=own["id"]).data == {}
    assert Event.objects.get(pk=shared["id"]).data == {"sale": "20%"}


def test_an_event_accepted_for_a_sensitive_type_stays_hidden_when_the_type_changes(owner, users):
    """Adversarial finding (issue 14): the event's data followed the type's current flag."""
    _client, http = owner
    make_type(sensitive=True)
    eid = post(http, {"type": "order_shipped", "user_id": "u0", "data": {"code": "111111"}}).json()["id"]
    NotificationType.objects.filter(pk="order_shipped").update(sensitive=False)
    assert http.get(f"/v1/events/{eid}").json()["data"] is None
    assert set(Notification.objects.filter(event_id=eid).values_list("sensitive", flat=True)) == {True}


def type_refusal(http, path: str, kind: str) -> tuple[int, str, str]:
    body = {"type": kind, "data": {}, **({"user_ids": ["u0"]} if path == "/v1/events" else
                                        {"user_id": "u0", "channel": "email"})}
    resp = post(http, body, key=f"misspelled-{kind}", path=path)
    (error,) = resp.json()["error"]["fields"]
    return resp.status_code, error["code"], error["message"]


@pytest.mark.parametrize("path", ["/v1/events", "/v1/notifications"])
def test_a_misspelled_type_suggests_the_near_key_the_client_may_use(owner, users, path):
    """``order_shiped`` was answered "define it with PUT …/order_shiped", inviting a duplicate type."""
    client, http = owner
    make_type("order_shipped")                                    # the admin's: every client may use it
    make_type("refund_issued", client=client)                     # the client's own
    make_type("invoice_paid", client=http_for("billing")[0])      # another client's: never suggested
    assert type_refusal(http, path, "order_shiped") == (
        422, "unknown_type", "no notification type 'order_shiped'; did you mean order_shipped?")
    assert type_refusal(http, path, "refund_isued") == (
        422, "unknown_type", "no notification type 'refund_isued'; did you mean refund_issued?")
    assert type_refusal(http, path, "invoice_payd") == (
        422, "unknown_type",
        "no notification type 'invoice_payd'; define it with PUT /v1/notification-types/invoice_payd")
    assert_nothing_written()

"""API key scopes (issue 11 #2): every API operation declares the scope it needs; a key without it is
refused with 403 ``missing_scope`` naming the scope, before the view runs, and nothing changes. The
default scopes, ``manage.py create_api_client``, ``allow_high`` as the scope
``notifications:send_high``, and the admin's checkboxes.

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client, RequestFactory
from django.urls import get_resolver
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.views import APIView

from campaigns import services as campaign_services
from campaigns.models import Campaign, Segment, SegmentMember, Template, TemplateVariant
from core import clock
from core.api.scopes import DEFAULT_SCOPES, Scope
from notifications.api.auth import HasRequiredScope, required_scope
from notifications.events import services as event_services
from notifications.events.models import Event, NotificationType, TypeTemplate
from notifications.inbox import store as inbox_store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import APIClient, DeliveryEvent, Notification
from notifications.webhooks import endpoints as webhook_endpoints
from notifications.webhooks.models import WebhookDelivery, WebhookEndpoint
from preferences.models import Device, Preferences, Recipient
from tests.conftest import reset_acceptance_windows

pytestmark = pytest.mark.django_db

#: API views served without a key (the schema and its docs): the only ones without scopes.
PUBLIC_VIEWS = {SpectacularAPIView, SpectacularSwaggerView}
METHODS = ("get", "post", "put", "patch", "delete")


def declared_operations():
    """``(OpenAPI path, method, declared scope or None, view class)`` for every method of every DRF
    view in the URL conf (the public schema views excepted)."""
    for pattern in get_resolver().url_patterns:
        view_class = getattr(pattern.callback, "cls", None)
        if view_class is None or not issubclass(view_class, APIView) or view_class in PUBLIC_VIEWS:
            continue
        route = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        for method in METHODS:
            if hasattr(view_class, method):
                yield route, method, required_scope(view_class, method), view_class


def test_every_api_view_declares_a_known_scope_for_each_method():
    operations = list(declared_operations())
    assert len(operations) == 44  # a new endpoint lands here: give it required_scopes
    for route, method, scope, view_class in operations:
        assert route.startswith("/v1/"), route
        assert scope in Scope.values, f"{view_class.__name__}.{method} ({method.upper()} {route}) declares no scope"
        if route.startswith("/v1/users/{user_id}/inbox"):
            # The inbox: its own scope for reading and marking (the audited cross-client exception).
            assert scope == Scope.INBOX, (route, method, scope)
            continue
        if route.startswith("/v1/webhook-endpoints"):
            # Where a client's status events go: its own scope for every method, reads included.
            assert scope == Scope.WEBHOOKS, (route, method, scope)
            continue
        assert (scope == Scope.READ) == (method == "get"), (route, method, scope)
        assert any(isinstance(p, HasRequiredScope) for p in view_class().get_permissions()), view_class


def test_a_method_without_a_declared_scope_is_refused():
    """Fail closed: a view that forgets its declaration answers 403 to every key."""

    class Forgetful(APIView):
        def get(self, request):
            raise AssertionError("must not run")

    _, key = APIClient.objects.create_key(name="all", scopes=list(Scope.values))
    request = RequestFactory().get("/v1/forgetful", headers={"Authorization": f"Api-Key {key}"})
    response = Forgetful.as_view()(request)
    assert response.status_code == 403
    assert response.data["error"]["code"] == "no_scope_declared"


# --- every endpoint, with and without its scopes ---------------------------------------------------

LATER = timedelta(days=2)


@dataclass(frozen=True)
class Endpoint:
    method: str
    route: str  # the OpenAPI path
    path: str  # with {nid} / {cid} for the world's notification and campaign
    ok: int
    scopes: tuple[str, ...]  # checked in this order: the declared one first
    body: dict | None = None
    extra_field: str = ""  # the request field that needs the second scope
    later_fields: tuple[tuple[str, str], ...] = ()  # (scope, field) for a third scope, named on its own field

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}{' +' + self.extra_field if self.extra_field else ''}"


SMS = {"user_id": "alice", "channel": "sms", "content": {"body": "hi"}}
CAMPAIGN = {"segment_id": "seg", "channel": "sms", "content": {"body": "Sale"}}
TEMPLATE = {"name": "T", "default_locale": "en", "variants": [{"locale": "en", "title": "Hi", "body": "Changed"}]}
TYPE = {"name": "Order", "category": "shipping", "channels": ["sms"],
        "templates": [{"channel": "sms", "locale": "en", "body": "Order {{ data.id }}"}]}
OTP_TYPE = TYPE | {"category": "security", "priority": "high", "quiet_hours": "bypass"}
#: Issue hfix2 #2: a type that overrides users' choices needs types:override (named on the field).
REQUIRED_TYPE = TYPE | {"category": "promo", "required": True}
BYPASS_TYPE = TYPE | {"category": "promo", "quiet_hours": "bypass"}
R, S = Scope.READ, Scope.SEND
ENDPOINTS = [
    Endpoint("post", "/v1/events", "/v1/events", 202, (S,), {"type": "order", "user_id": "alice"}),
    Endpoint("post", "/v1/events", "/v1/events", 202, (S, Scope.SEND_HIGH), {"type": "otp", "user_id": "alice"},
             extra_field="type"),
    Endpoint("get", "/v1/events/{event_id}", "/v1/events/{eid}", 200, (R,)),
    Endpoint("get", "/v1/events/{event_id}/recipients", "/v1/events/{eid}/recipients", 200, (R,)),
    Endpoint("post", "/v1/events/{event_id}/cancel", "/v1/events/{eid}/cancel", 200, (S,)),
    Endpoint("get", "/v1/notification-types", "/v1/notification-types", 200, (R,)),
    Endpoint("get", "/v1/notification-types/{key}", "/v1/notification-types/order", 200, (R,)),
    Endpoint("put", "/v1/notification-types/{key}", "/v1/notification-types/order", 200, (Scope.TYPES_WRITE,), TYPE),
    Endpoint("put", "/v1/notification-types/{key}", "/v1/notification-types/otp", 200,
             (Scope.TYPES_WRITE, Scope.SEND_HIGH, Scope.TYPES_OVERRIDE), OTP_TYPE, extra_field="priority",
             later_fields=((Scope.TYPES_OVERRIDE, "quiet_hours"),)),
    Endpoint("put", "/v1/notification-types/{key}", "/v1/notification-types/promo", 201,
             (Scope.TYPES_WRITE, Scope.TYPES_OVERRIDE), REQUIRED_TYPE, extra_field="required"),
    Endpoint("put", "/v1/notification-types/{key}", "/v1/notification-types/promo", 201,
             (Scope.TYPES_WRITE, Scope.TYPES_OVERRIDE), BYPASS_TYPE, extra_field="quiet_hours"),
    Endpoint("get", "/v1/users/{user_id}", "/v1/users/alice", 200, (R,)),
    Endpoint("put", "/v1/users/{user_id}", "/v1/users/alice", 200, (Scope.RECIPIENTS_WRITE,),
             {"email": "new@example.com", "phone": "+4915199999999"}),
    Endpoint("delete", "/v1/users/{user_id}", "/v1/users/alice", 200, (Scope.RECIPIENTS_WRITE,)),
    Endpoint("get", "/v1/users/{user_id}/notifications", "/v1/users/alice/notifications", 200, (R,)),
    Endpoint("get", "/v1/users/{user_id}/inbox", "/v1/users/alice/inbox", 200, (Scope.INBOX,)),
    Endpoint("get", "/v1/users/{user_id}/inbox/counts", "/v1/users/alice/inbox/counts", 200, (Scope.INBOX,)),
    Endpoint("post", "/v1/users/{user_id}/inbox/mark", "/v1/users/alice/inbox/mark", 200, (Scope.INBOX,),
             {"all_before": "2099-01-01T00:00:00Z", "status": "read"}),
    Endpoint("get", "/v1/users/{user_id}/preferences", "/v1/users/alice/preferences", 200, (R,)),
    Endpoint("put", "/v1/users/{user_id}/preferences", "/v1/users/alice/preferences", 200,
             (Scope.PREFERENCES_WRITE,), {"opt_outs": ["sms", "email", "push"]}),
    Endpoint("get", "/v1/users/{user_id}/devices", "/v1/users/alice/devices", 200, (R,)),
    Endpoint("put", "/v1/users/{user_id}/devices", "/v1/users/alice/devices", 201, (Scope.DEVICES_WRITE,),
             {"platform": "android", "push_token": "tok-new"}),
    Endpoint("delete", "/v1/users/{user_id}/devices/{push_token}", "/v1/users/alice/devices/tok-alice", 204,
             (Scope.DEVICES_WRITE,)),
    Endpoint("post", "/v1/notifications", "/v1/notifications", 202, (S,), SMS),
    Endpoint("post", "/v1/notifications", "/v1/notifications", 202, (S, Scope.SEND_HIGH), SMS | {"priority": "high"},
             extra_field="priority"),
    Endpoint("get", "/v1/notifications/{notification_id}", "/v1/notifications/{nid}", 200, (R,)),
    Endpoint("post", "/v1/notifications/{notification_id}/cancel", "/v1/notifications/{nid}/cancel", 200, (S,)),
    Endpoint("post", "/v1/notifications/{notification_id}/receipts", "/v1/notifications/{pid}/receipts", 201,
             (Scope.RECEIPTS,),
             {"event": "opened"}),
    Endpoint("get", "/v1/segments", "/v1/segments", 200, (R,)),
    Endpoint("get", "/v1/segments/{segment_id}", "/v1/segments/seg", 200, (R,)),
    Endpoint("put", "/v1/segments/{segment_id}", "/v1/segments/seg", 200, (Scope.SEGMENTS_WRITE,),
             {"name": "Renamed"}),
    Endpoint("get", "/v1/segments/{segment_id}/members", "/v1/segments/seg/members", 200, (R,)),
    Endpoint("post", "/v1/segments/{segment_id}/members", "/v1/segments/plain/members", 200,
             (Scope.SEGMENTS_WRITE,), {"add": ["bob"]}),
    Endpoint("post", "/v1/segments/{segment_id}/members", "/v1/segments/seg/members", 200,
             (Scope.SEGMENTS_WRITE, Scope.SEND_HIGH), {"add": ["bob"]}, extra_field="segment_id"),
    Endpoint("post", "/v1/segment-preview", "/v1/segment-preview", 200, (Scope.SEGMENTS_WRITE,),
             {"rules": {"has": "email"}}),
    Endpoint("get", "/v1/templates", "/v1/templates", 200, (R,)),
    Endpoint("get", "/v1/templates/{template_id}", "/v1/templates/tpl", 200, (R,)),
    Endpoint("put", "/v1/templates/{template_id}", "/v1/templates/tpl", 200, (Scope.TEMPLATES_WRITE,), TEMPLATE),
    Endpoint("put", "/v1/templates/{template_id}", "/v1/templates/otp-tpl", 200,
             (Scope.TEMPLATES_WRITE, Scope.SEND_HIGH), TEMPLATE, extra_field="template_id"),
    Endpoint("get", "/v1/campaigns", "/v1/campaigns", 200, (R,)),
    Endpoint("post", "/v1/campaigns", "/v1/campaigns", 202, (Scope.CAMPAIGNS_WRITE,), CAMPAIGN),
    Endpoint("post", "/v1/campaigns", "/v1/campaigns", 202, (Scope.CAMPAIGNS_WRITE, Scope.SEND_HIGH),
             CAMPAIGN | {"priority": "high", "category": "security"}, extra_field="priority"),
    Endpoint("get", "/v1/campaigns/{campaign_id}", "/v1/campaigns/{cid}", 200, (R,)),
    Endpoint("post", "/v1/campaigns/{campaign_id}/cancel", "/v1/campaigns/{cid}/cancel", 200,
             (Scope.CAMPAIGNS_WRITE,)),
    Endpoint("post", "/v1/campaigns/{campaign_id}/cancel", "/v1/campaigns/{hcid}/cancel", 200,
             (Scope.CAMPAIGNS_WRITE, Scope.SEND_HIGH), extra_field="campaign_id"),
    Endpoint("get", "/v1/campaigns/{campaign_id}/runs", "/v1/campaigns/{cid}/runs", 200, (R,)),
    # The world's campaign is not recurring: past the scope, the view's own rule answers 409 not_recurring.
    Endpoint("post", "/v1/campaigns/{campaign_id}/pause", "/v1/campaigns/{cid}/pause", 409,
             (Scope.CAMPAIGNS_WRITE,)),
    Endpoint("post", "/v1/campaigns/{campaign_id}/resume", "/v1/campaigns/{cid}/resume", 409,
             (Scope.CAMPAIGNS_WRITE,)),
    Endpoint("get", "/v1/webhook-endpoints", "/v1/webhook-endpoints", 200, (Scope.WEBHOOKS,)),
    Endpoint("post", "/v1/webhook-endpoints", "/v1/webhook-endpoints", 201, (Scope.WEBHOOKS,),
             {"url": "https://hooks.example.com/n", "events": ["notification.sent"]}),
    Endpoint("get", "/v1/webhook-endpoints/{endpoint_id}", "/v1/webhook-endpoints/{wid}", 200, (Scope.WEBHOOKS,)),
    Endpoint("delete", "/v1/webhook-endpoints/{endpoint_id}", "/v1/webhook-endpoints/{wid}", 204,
             (Scope.WEBHOOKS,)),
    Endpoint("post", "/v1/webhook-endpoints/{endpoint_id}/test", "/v1/webhook-endpoints/{wid}/test", 202,
             (Scope.WEBHOOKS,)),
]


def test_the_endpoint_table_covers_every_operation():
    assert {(e.route, e.method, e.scopes[0]) for e in ENDPOINTS} == {
        (route, method, scope) for route, method, scope, _ in declared_operations()}


def build_world(client: APIClient) -> dict[str, str]:
    """alice (phone, email, a device) in segment ``seg``, and an empty segment ``plain``; templates
    ``tpl`` and ``otp-tpl``, the latter used (with ``seg``) by a scheduled high-priority campaign; a
    scheduled campaign and single send: all of ``client``'s. Returns the ids the paths need."""
    alice = Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915112345678",
                                     timezone="Europe/Berlin")
    Device.objects.create(recipient=alice, platform="android", push_token="tok-alice")
    segment = Segment.objects.create(segment_id="seg", name="Seg", client=client)
    SegmentMember.objects.create(segment=segment, recipient=alice)
    Segment.objects.create(segment_id="plain", name="Plain", client=client)
    for template_id in ("tpl", "otp-tpl"):
        template = Template.objects.create(template_id=template_id, name="T", default_locale="en", client=client)
        TemplateVariant.objects.create(template=template, locale="en", title="Hi", body="Hi")
    high = campaign_services.create_campaign(client=client, idempotency_key="otp", segment=segment, channel="sms",
                                             priority="high", category="security", template=template,
                                             scheduled_at=clock.now() + LATER).campaign
    campaign = campaign_services.create_campaign(client=client, idempotency_key="world", segment=segment,
                                                 channel="sms", body="Sale", scheduled_at=clock.now() + LATER).campaign
    single = Notification.objects.create(id=uuid.uuid4(), client=client, recipient=alice, channel="sms", body="x",
                                         status="scheduled", scheduled_at=clock.now() + LATER)
    pushed = Notification.objects.create(id=uuid.uuid4(), client=client, recipient=alice, channel="push", body="x",
                                         status="sent", sent_at=clock.now())
    # alice's inbox holds one item (the mark endpoint has something to change).
    in_app = Notification.objects.create(id=uuid.uuid4(), client=client, recipient=alice, channel="in_app", body="Hi",
                                         status="sent", sent_at=clock.now())
    inbox_store.write([inbox_store.NewItem(in_app.pk, "alice", "", "", "Hi", "Hi", None, clock.now(), None)])
    kinds = {}
    for key, body in (("order", TYPE), ("otp", OTP_TYPE)):
        fields = {k: v for k, v in body.items() if k != "templates"}
        kinds[key], _ = event_services.save_type(key, fields, body["templates"], client=client)
    event = event_services.accept_event(client=client, idempotency_key="world", fingerprint="f", kind=kinds["order"],
                                        recipients=[alice], data={}, scheduled_at=clock.now() + LATER).event
    hook = webhook_endpoints.create(client, "https://hooks.example.com/world", ["notification.sent"])
    return {"nid": str(single.pk), "cid": str(campaign.pk), "hcid": str(high.pk), "eid": str(event.pk),
            "pid": str(pushed.pk), "wid": str(hook.pk)}


WORLD_MODELS = (Recipient, Device, Preferences, Notification, DeliveryEvent, Segment, SegmentMember, Template,
                TemplateVariant, Campaign, NotificationType, TypeTemplate, Event, InboxItem, InboxCounts,
                WebhookEndpoint, WebhookDelivery)


def snapshot() -> dict[str, list[dict]]:
    """Every row of every table an endpoint could change, all columns."""
    return {m.__name__: list(m.objects.order_by("pk").values()) for m in WORLD_MODELS}


def call(endpoint: Endpoint, key: str, ids: dict[str, str]):
    http = Client(headers={"Authorization": f"Api-Key {key}", "Idempotency-Key": uuid.uuid4().hex})
    body = json.dumps(endpoint.body) if endpoint.body is not None else None
    return getattr(http, endpoint.method)(endpoint.path.format(**ids), data=body, content_type="application/json")


def missing_scope_body(scope: str, field: str, why: str = "") -> dict:
    message = f"this API key lacks the scope {scope}" + (f" ({why})" if why else "")
    return {"error": {"status": 403, "code": "missing_scope", "message": f"{field}: {message}",
                      "fields": [{"field": field, "code": "missing_scope", "message": message}]}}


def check(endpoint: Endpoint, held: set[str]) -> None:
    """One request by a fresh client holding ``held``: allowed iff ``held`` contains every scope of the
    endpoint; refused with 403 naming the first missing scope, every row unchanged."""
    client, key = APIClient.objects.create_key(name="scoped", scopes=sorted(held))
    ids = build_world(client)
    reset_acceptance_windows()  # a fresh world: alice has been sent no OTP yet
    before = snapshot()
    r = call(endpoint, key, ids)
    missing = [s for s in endpoint.scopes if s not in held]
    if not missing:
        assert r.status_code == endpoint.ok, (str(endpoint), sorted(held), r.content)
        return
    assert r.status_code == 403, (str(endpoint), sorted(held), r.content)
    if missing[0] == endpoint.scopes[0]:
        assert r.json() == missing_scope_body(missing[0], "Authorization")
    else:
        assert r.json()["error"]["code"] == "missing_scope"
        field = dict(endpoint.later_fields).get(missing[0], endpoint.extra_field)
        assert r.json()["error"]["fields"] == [{"field": field, "code": "missing_scope",
                                                "message": r.json()["error"]["fields"][0]["message"]}]
        assert f"lacks the scope {missing[0]}" in r.json()["error"]["message"]
    assert snapshot() == before, f"{endpoint} refused but wrote"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=str)
def test_each_endpoint_is_allowed_with_its_scopes_and_refused_without_each(endpoint):
    for held in [set(endpoint.scopes), set(Scope.values),
                 *({s for s in Scope.values if s != scope} for scope in endpoint.scopes)]:
        with transaction.atomic():
            check(endpoint, held)
            transaction.set_rollback(True)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(held=st.sets(st.sampled_from(Scope.values)), endpoint=st.sampled_from(ENDPOINTS))
def test_generated_scope_sets_allowed_iff_they_contain_the_endpoints_scopes(held, endpoint):
    with transaction.atomic():
        check(endpoint, held)
        transaction.set_rollback(True)


# --- the client's scopes -----------------------------------------------------------------------------

def test_default_scopes_are_send_and_read():
    client, _ = APIClient.objects.create_key(name="plain")
    assert client.scopes == ["notifications:send", "read"] == list(DEFAULT_SCOPES)
    assert not client.allow_high


def test_allow_high_is_the_scope_send_high():
    client, _ = APIClient.objects.create_key(name="otp", allow_high=True)
    assert client.scopes == ["notifications:send", "notifications:send_high", "read"]
    client.allow_high = False
    assert client.scopes == ["notifications:send", "read"]
    client.scopes = ["read", "notifications:send_high"]
    assert client.allow_high


def test_unknown_scopes_fail_validation():
    client = APIClient(name="typo", scopes=["read", "recipient:write"])
    with pytest.raises(ValidationError, match="unknown scopes: recipient:write"):
        client.full_clean()


def create(*args: str) -> tuple[APIClient, str]:
    out = io.StringIO()
    call_command("create_api_client", *args, stdout=out)
    lines = out.getvalue().splitlines()
    return APIClient.objects.get_from_key(lines[-1]), lines[0]


def test_create_api_client_defaults_to_send_and_read():
    client, said = create("auth-service")
    assert client.scopes == ["notifications:send", "read"]
    assert "scopes notifications:send, read" in said


def test_create_api_client_with_scopes_and_allow_high():
    client, _ = create("user-service", "--scopes", "read, recipients:write,devices:write,read", "--allow-high")
    assert client.scopes == ["notifications:send_high", "recipients:write", "devices:write", "read"]
    client, _ = create("otp", "--allow-high")
    assert client.scopes == ["notifications:send", "notifications:send_high", "read"]


def test_create_api_client_refuses_unknown_scopes():
    with pytest.raises(CommandError, match="--scopes: unknown scope recipient:write; known: notifications:send, "):
        create("typo", "--scopes", "read,recipient:write")
    assert not APIClient.objects.exists()


# --- the admin ---------------------------------------------------------------------------------------

def test_admin_api_client_page_sets_scopes_with_checkboxes(admin_client, fast_password_hashing):
    client, _ = APIClient.objects.create_key(name="user-service", scopes=["recipients:write", "read"])
    url = f"/admin/notifications/apiclient/{client.prefix}/change/"
    page = admin_client.get(url).content.decode()
    for scope in Scope.values:
        checked = " checked" if scope in ("recipients:write", "read") else ""
        assert re.search(rf'<input type="checkbox" name="scopes" value="{re.escape(scope)}"[^>]*{checked}', page), scope
    r = admin_client.post(url, {"name": "user-service", "scopes": ["devices:write", "recipients:write"],
                                "rate_limit": ""})
    assert r.status_code == 302, r.content.decode()[:3000]
    client.refresh_from_db()
    assert client.scopes == ["recipients:write", "devices:write"]
    assert client.name == "user-service"


def test_admin_adds_a_client_with_the_checked_scopes(admin_client, fast_password_hashing):
    r = admin_client.post("/admin/notifications/apiclient/add/", {
        "name": "otp-service", "scopes": ["notifications:send", "notifications:send_high"], "rate_limit": ""})
    assert r.status_code == 302, r.content.decode()[:3000]
    client = APIClient.objects.get(name="otp-service")
    assert client.scopes == ["notifications:send", "notifications:send_high"]
    assert client.allow_high


# --- methods a view does not implement: 405 before the scope check (issue 12 #3) --------------------

ALL_METHODS = ("get", "post", "put", "patch", "delete")


@pytest.mark.parametrize("scopes", [list(Scope.values), []], ids=["every scope", "no scope"])
def test_a_method_the_view_does_not_implement_is_405_with_allow_whatever_the_scopes(scopes):
    """``PATCH /v1/users/x``, ``DELETE /v1/segments/x``, ``GET /v1/users/x/devices/<token>`` answered 403
    ``no_scope_declared``: DRF's method check now answers first, in the API's error shape."""
    _, key = APIClient.objects.create_key(name="methods", scopes=scopes)
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    seen = 0
    for pattern in get_resolver().url_patterns:
        view_class = getattr(pattern.callback, "cls", None)
        if view_class is None or not issubclass(view_class, APIView) or view_class in PUBLIC_VIEWS:
            continue
        path = "/" + re.sub(r"<(?:(\w+):)?(\w+)>",
                            lambda m: "00000000-0000-0000-0000-000000000000" if m.group(1) == "uuid" else "x",
                            str(pattern.pattern))
        implemented = [m for m in ALL_METHODS if hasattr(view_class, m)]
        allow = {m.upper() for m in implemented} | {"OPTIONS"} | ({"HEAD"} if "get" in implemented else set())
        for method in ALL_METHODS:
            if method in implemented:
                continue
            seen += 1
            r = http.get(path) if method == "get" else getattr(http, method)(path, data="{}",
                                                                               content_type="application/json")
            assert r.status_code == 405, (method, path, r.content)
            assert set(r.headers["Allow"].split(", ")) == allow, (method, path, r.headers["Allow"])
            message = f"{method.upper()} is not allowed on this endpoint; it allows {r.headers['Allow']}"
            assert r.json() == {"error": {"status": 405, "code": "method_not_allowed",
                                          "message": f"method: {message}",
                                          "fields": [{"field": "method", "code": "method_not_allowed",
                                                      "message": message}]}}, (method, path)
    assert seen == 33 * len(ALL_METHODS) - 44


def test_the_reported_methods_are_405():
    _, key = APIClient.objects.create_key(name="methods", scopes=list(Scope.values))
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    assert http.patch("/v1/users/x").status_code == 405
    assert http.delete("/v1/segments/x").status_code == 405
    r = http.get("/v1/users/x/devices/tok")
    assert (r.status_code, r.headers["Allow"]) == (405, "DELETE, OPTIONS")
    assert http.options("/v1/users/x/devices/tok").status_code == 200  # OPTIONS: implemented, scope read


def test_an_implemented_method_without_a_declared_scope_still_fails_closed():
    class HalfDeclared(APIView):
        required_scopes = {"get": Scope.READ}

        def get(self, request):
            raise AssertionError("not this one")

        def post(self, request):
            raise AssertionError("must not run")

    _, key = APIClient.objects.create_key(name="all", scopes=list(Scope.values))
    request = RequestFactory().post("/v1/half", headers={"Authorization": f"Api-Key {key}"})
    response = HalfDeclared.as_view()(request)
    assert (response.status_code, response.data["error"]["code"]) == (403, "no_scope_declared")
    request = RequestFactory().delete("/v1/half", headers={"Authorization": f"Api-Key {key}"})
    assert HalfDeclared.as_view()(request).status_code == 405


@pytest.mark.django_db
def test_owners_of_overriding_types_keep_replacing_them_across_the_migration():
    """types:override is not a default; the migration gives it to keys that own a required or
    bypass type (they could replace it as it is before), and to no one else."""
    import importlib
    from types import SimpleNamespace

    from django.apps import apps
    from django.db import connection

    from notifications.events.models import NotificationType

    assert Scope.TYPES_OVERRIDE not in APIClient.objects.create_key(name="plain")[0].scopes
    owners = {name: APIClient.objects.create_key(name=name, scopes=[Scope.SEND, Scope.TYPES_WRITE, Scope.READ])[0]
              for name in ("required", "bypass", "plain-type", "none")}
    for key, over in (("required", {"required": True}), ("bypass", {"quiet_hours": "bypass"}), ("plain-type", {})):
        NotificationType.objects.create(key=f"t_{key.replace('-', '_')}", name="T", category="account",
                                        channels=["email"], client=owners[key], **over)
    migration = importlib.import_module("notifications.migrations.0030_types_override_scope")
    migration.grant_to_owners_of_overriding_types(apps, SimpleNamespace(connection=connection))
    scopes = {c.name: c.scopes for c in APIClient.objects.filter(pk__in=[c.pk for c in owners.values()])}
    granted = ["notifications:send", "types:write", "types:override", "read"]
    plain = ["notifications:send", "types:write", "read"]
    assert scopes == {"required": granted, "bypass": granted, "plain-type": plain, "none": plain}

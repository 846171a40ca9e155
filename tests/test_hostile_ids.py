"""Path ids and query parameters that cannot be stored or are not ids (issue 12 #2, #5): every API URL
pattern and every documented query parameter, with NUL and control characters, answers a 4xx in the
API's one error shape, never a 5xx (Postgres text cannot hold NUL: psycopg's DataError was a 500).
One rule per kind of id (notifications/api/parameters.py): a value that breaks it is a 422 naming
the parameter.

In-process (Django test client, rolled-back transactions).
"""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import get_resolver
from rest_framework.views import APIView

from campaigns import services as campaign_services
from campaigns.models import Campaign
from notifications.events.models import Event, NotificationType
from notifications.models import APIClient
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

#: NUL (cannot be stored), C0, DEL, C1 (U+0085 NEL, U+009F), and a line separator inside an id.
HOSTILE = ["\x00", "x\x00y", "\x00x", "a\x01b", "tab\there", "nl\n", "del\x7f", "nel\x85", "c1\x9f",
           "\ud800", "%00"]
VALID = {"user_id": "alice", "push_token": "tok-alice", "segment_id": "vip", "template_id": "welcome",
         "notification_id": "00000000-0000-0000-0000-000000000000",
         "campaign_id": "00000000-0000-0000-0000-000000000000",
         "event_id": "00000000-0000-0000-0000-00000000e7e7"}


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="hostile", scopes=EVERY_SCOPE)
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def world(http):
    client = APIClient.objects.get(name="hostile")
    alice = Recipient.objects.create(user_id="alice", phone="+4915112345678")
    Device.objects.create(recipient=alice, platform="android", push_token="tok-alice")
    segment, _ = campaign_services.upsert_segment("vip", name="VIP", client=client)
    campaign_services.change_members(segment, add=["alice"], remove=[])
    campaign_services.upsert_template("welcome", name="Welcome", default_locale="en", client=client,
                                      variants=[{"locale": "en", "body": "Hi"}])
    kind = NotificationType.objects.create(key="order", name="Order", category="shipping", channels=["sms"])
    Event.objects.create(id=VALID["event_id"], client=client, type=kind, user_ids=["alice"], channels=["sms"],
                         routing="all")  # its recipients listing answers, so its query parameters are walked
    Campaign.objects.create(id=VALID["campaign_id"], client=client, segment=segment, channel="sms",
                            body="Hi")  # its read and its runs answer, so their query parameters are walked


def api_routes():
    """``(route with <name> placeholders, view class)`` for every /v1/ URL pattern."""
    for pattern in get_resolver().url_patterns:
        view = getattr(pattern.callback, "cls", None)
        route = str(pattern.pattern)
        if view is not None and issubclass(view, APIView) and route.startswith("v1/"):
            yield "/" + route, view


def encoded(value: str) -> str:
    """``value`` in a URL: percent-encoded UTF-8 (a lone surrogate as its bytes would be: invalid UTF-8)."""
    if value == "%00":
        return "%2500"
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def fill(route: str, hostile_name: str | None = None, hostile: str = "") -> str:
    def one(match):
        name = match.group(2)
        return encoded(hostile) if name == hostile_name else VALID[name]
    return re.sub(r"<(?:(\w+):)?(\w+)>", one, route)


def assert_error_shape(r, field: str | None = None):
    assert r.status_code < 500, (r.status_code, r.content[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["status"] == r.status_code and error["code"] and error["message"]
        if field is not None:
            assert error["fields"][0]["field"] == field, error
            assert error["message"].startswith(f"{field}: "), error


def request(http, method: str, path: str):
    return getattr(http, method)(path, data=json.dumps({}), content_type="application/json",
                                 headers={"Idempotency-Key": "k1"}) if method != "get" else http.get(path)


def test_the_walk_covers_every_api_route():
    routes = [route for route, _ in api_routes()]
    assert len(routes) == 33 and sum("<" in r for r in routes) == 25, routes


def has_control_character(value: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in value)


@pytest.mark.parametrize("hostile", HOSTILE, ids=ascii)
def test_every_path_id_of_every_route_with_control_characters_is_never_a_5xx(http, world, hostile):
    for route, view in api_routes():
        for converter, name in re.findall(r"<(?:(\w+):)?(\w+)>", route):
            path = fill(route, name, hostile)
            for method in ("get", "put", "post", "delete", "patch"):
                r = request(http, method, path)
                assert_error_shape(r)
                if converter != "uuid" and hasattr(view, method) and has_control_character(hostile):
                    # A text id, on a method the view implements: the id's rule answers, naming it.
                    assert r.status_code == 422, (method, path, r.status_code, r.content[:300])
                    assert_error_shape(r, name)


def documented_queries(http):
    schema = http.get("/api/schema/", {"format": "json"}).json()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "query":
                    yield path, method, parameter["name"]


def test_every_documented_query_parameter_is_walked(http):
    assert {(p, name) for p, _, name in documented_queries(http)} >= {
        ("/v1/users/{user_id}/notifications", "category"), ("/v1/campaigns", "segment_id"),
        ("/v1/segments/{segment_id}/members", "cursor")}


@pytest.mark.parametrize("hostile", HOSTILE, ids=ascii)
def test_every_documented_query_parameter_with_control_characters_is_a_422_naming_it(http, world, hostile):
    for path, method, name in documented_queries(http):
        assert method == "get"
        url = re.sub(r"\{(\w+)\}", lambda m: VALID[m.group(1)], path) + f"?{name}={encoded(hostile)}"
        r = http.get(url)
        # The inbox's cursor is signed: anything but one of its next_cursor values is a 400 (issue 16).
        expected = 400 if (path, name) == ("/v1/users/{user_id}/inbox", "cursor") else 422
        assert r.status_code == expected, (url, r.content[:300])
        assert_error_shape(r, name)


@pytest.mark.parametrize("path", ["/v1/segments", "/v1/templates", "/v1/segments/vip/members",
                                  "/v1/users/alice/notifications", "/v1/campaigns"])
@pytest.mark.parametrize("value", ["\x00", "a\x00", "\ud800"], ids=ascii)
def test_a_forged_cursor_holding_nul_is_422(http, world, path, value):
    for values in ([value], [value, value]):
        raw = json.dumps(values).encode()
        r = http.get(path, {"cursor": base64.urlsafe_b64encode(raw).decode().rstrip("=")})
        assert r.status_code == 422, (path, values, r.content[:300])
        assert_error_shape(r, "cursor")


@pytest.mark.parametrize(("path", "field"), [
    ("/v1/segments/%00", "segment_id"), ("/v1/segments/x%00y", "segment_id"),
    ("/v1/segments/%00/members", "segment_id"), ("/v1/templates/%00", "template_id"),
    ("/v1/campaigns?segment_id=%00", "segment_id"), ("/v1/users/alice/notifications?category=%00", "category"),
    ("/v1/users/%C2%85/notifications", "user_id"), ("/v1/users/alice/devices/a%C2%85", "push_token"),
])
def test_the_reported_urls_are_422_naming_the_parameter(http, world, path, field):
    method = "delete" if "devices/" in path else "get"
    r = getattr(http, method)(path)
    assert r.status_code == 422, r.content
    assert r.json()["error"]["code"] == "validation_error"
    # Issue 23 #11: an invisible character is code control_character wherever it is refused.
    assert r.json()["error"]["fields"][0] == {"field": field, "code": "control_character",
                                              "message": r.json()["error"]["fields"][0]["message"]}


def _b64(values) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def test_every_list_answers_only_its_own_cursor(http, world):
    # A fresh attack on main: list cursors were unsigned base64 JSON, so the segments' cursor
    # ["seg1"] was read on by every list ordered by one text key (200), a made-up ["x"] too, and a
    # campaign-style cursor with a naive instant read on /v1/campaigns. Every list's cursor is now
    # signed and bound to its listing (core/cursors.py): anything else is invalid_cursor.
    client = APIClient.objects.get(name="hostile")
    campaign_services.upsert_segment("seg1", name="One", client=client)
    segments = http.get("/v1/segments", {"limit": 1}).json()
    assert [s["segment_id"] for s in segments["items"]] == ["seg1"] and segments["next_cursor"]
    cursors = {"segments' cursor": segments["next_cursor"], "made up": _b64(["x"]), "made up, seg1": _b64(["seg1"]),
               "naive instant": _b64(["2026-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"]),
               "signed by another key": segments["next_cursor"][:-1] + ("A" if segments["next_cursor"][-1] != "A"
                                                                        else "B")}
    lists = sorted({p for p, _, name in documented_queries(http) if name == "cursor"})
    assert len(lists) == 10, lists
    for path in lists:
        url = re.sub(r"\{(\w+)\}", lambda m: VALID[m.group(1)], path)
        for what, cursor in cursors.items():
            if path == "/v1/segments" and what == "segments' cursor":
                continue
            r = http.get(url, {"cursor": cursor})
            expected = 400 if path == "/v1/users/{user_id}/inbox" else 422  # the inbox's documented status
            assert (r.status_code, r.json()["error"]["fields"][0]["code"]) == (expected, "invalid_cursor"), (
                path, what, r.content[:300])
            assert_error_shape(r, "cursor")
    assert http.get("/v1/segments", {"cursor": segments["next_cursor"]}).json()["items"][0]["segment_id"] == "vip"

"""``GET /v1/events/{id}`` and ``GET /v1/events/{id}/recipients``: the detail is bounded whatever the
event's size (a summary counting every user, the first page of recipients), the listing pages through
every user exactly once by keyset (the detail's cursor continues it), and both run a fixed number of
queries whatever the page. In-process (Django test client, rolled-back transactions)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications.api.event_reads import FIRST_PAGE
from notifications.models import DeliveryEvent, Notification
from preferences.models import Recipient
from tests.test_events_api import http_for, make_type, post

pytestmark = pytest.mark.django_db

USERS = 25


@pytest.fixture
def event():
    """A 25-user, 3-channel event: u00 reached by push, u01 not reached on any channel, the rest
    pending (as accepted); u00's push has two more timeline lines."""
    _client, http = http_for("orders")
    make_type()
    Recipient.objects.bulk_create([Recipient(user_id=f"u{i:02d}", email=f"u{i}@example.org",
                                             phone=f"+1555000{i:04d}") for i in range(USERS)])
    resp = post(http, {"type": "order_shipped", "user_ids": [f"u{i:02d}" for i in reversed(range(USERS))],
                       "data": {"order_id": "1"}})
    assert resp.status_code == 202, resp.content
    eid = resp.json()["id"]
    rows = Notification.objects.filter(event_id=eid)
    rows.filter(recipient_id="u00", channel="push").update(status="sent")
    rows.filter(recipient_id="u00").exclude(channel="push").update(status="suppressed", reason="opted_out")
    rows.filter(recipient_id="u01").update(status="failed", reason="invalid_contact")
    push = rows.get(recipient_id="u00", channel="push")
    DeliveryEvent.objects.bulk_create([DeliveryEvent(notification=push, kind="claimed", status="sending"),
                                       DeliveryEvent(notification=push, kind="delivered", status="delivered")])
    return http, eid


def test_the_detail_counts_every_user_and_shows_only_the_first_page(event):
    http, eid = event
    body = http.get(f"/v1/events/{eid}").json()
    assert body["summary"] == {
        "users": USERS, "outcomes": {"reached": 1, "pending": USERS - 2, "not_reached": 1, "unknown": 0},
        "channels": {"push": {"failed": 1, "scheduled": USERS - 2, "sent": 1},
                     "email": {"failed": 1, "scheduled": USERS - 2, "suppressed": 1},
                     "sms": {"failed": 1, "scheduled": USERS - 2, "suppressed": 1}}}
    assert [r["user_id"] for r in body["recipients"]] == [f"u{i:02d}" for i in range(FIRST_PAGE)]
    first = body["recipients"][0]
    assert (first["outcome"], [(n["channel"], n["status"], [t["kind"] for t in n["timeline"]])
                               for n in first["notifications"]]) == (
        "reached", [("push", "sent", ["accepted", "claimed", "delivered"]), ("email", "suppressed", ["accepted"]),
                    ("sms", "suppressed", ["accepted"])])
    assert [r["outcome"] for r in body["recipients"][1:3]] == ["not_reached", "pending"]
    assert body["recipients_next_cursor"] is not None


def test_the_listing_pages_through_every_user_once_and_continues_the_detail(event):
    http, eid = event
    seen, cursor, pages = [], "", 0
    while True:
        resp = http.get(f"/v1/events/{eid}/recipients?limit=10" + (f"&cursor={cursor}" if cursor else ""))
        assert resp.status_code == 200, resp.content
        page = resp.json()
        assert len(page["items"]) <= 10
        assert all(len(r["notifications"]) == 3 for r in page["items"])
        seen += [r["user_id"] for r in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert (seen, pages) == ([f"u{i:02d}" for i in range(USERS)], 3)
    after = http.get(f"/v1/events/{eid}").json()["recipients_next_cursor"]
    rest = http.get(f"/v1/events/{eid}/recipients?cursor={after}").json()
    assert ([r["user_id"] for r in rest["items"]], rest["next_cursor"]) == (seen[FIRST_PAGE:], None)
    assert http.get(f"/v1/events/{eid}/recipients").json()["items"] == \
        http.get(f"/v1/events/{eid}").json()["recipients"] + rest["items"]


@pytest.mark.parametrize(("query", "field", "code"), [("limit=0", "limit", "min_value"),
                                                      ("limit=201", "limit", "max_value"),
                                                      ("cursor=nope", "cursor", "invalid_cursor"),
                                                      ("outcome=reached", "outcome", "unknown_parameter")])
def test_a_bad_query_is_422_naming_the_parameter(event, query, field, code):
    http, eid = event
    resp = http.get(f"/v1/events/{eid}/recipients?{query}")
    assert resp.status_code == 422
    assert [(f["field"], f["code"]) for f in resp.json()["error"]["fields"]] == [(field, code)]


def test_another_clients_event_is_404_in_the_listing(event):
    _http, eid = event
    _other, stranger = http_for("stranger")
    resp = stranger.get(f"/v1/events/{eid}/recipients")
    assert (resp.status_code, resp.json()["error"]["fields"][0]["field"]) == (404, "event_id")


def queries(http, path) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert http.get(path).status_code == 200
    return len(captured)


def test_reads_run_a_fixed_number_of_queries_whatever_the_page(event):
    http, eid = event
    one = queries(http, f"/v1/events/{eid}/recipients?limit=1")
    assert queries(http, f"/v1/events/{eid}/recipients?limit=200") == one
    assert queries(http, f"/v1/events/{eid}") <= one + 2  # the summary's two


def test_an_events_cursor_reads_on_only_in_that_events_listing(event):
    # A fresh attack on main: list cursors were unsigned, so one event's cursor read on in another's.
    http, eid = event
    other = post(http, {"type": "order_shipped", "user_ids": ["u03", "u04"], "data": {"order_id": "2"}},
                 key="other-event")
    assert other.status_code == 202, other.content
    cursor = http.get(f"/v1/events/{eid}").json()["recipients_next_cursor"]
    resp = http.get(f"/v1/events/{other.json()['id']}/recipients", {"cursor": cursor})
    assert resp.status_code == 422
    assert [(f["field"], f["code"]) for f in resp.json()["error"]["fields"]] == [("cursor", "invalid_cursor")]
    assert http.get(f"/v1/events/{eid}/recipients", {"cursor": cursor}).status_code == 200

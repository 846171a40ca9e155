"""The inbox API (issue 16, docs/APP.md): ``GET /v1/users/{id}/inbox`` (keyset pages, signed cursor),
``GET …/inbox/counts`` (the badge), ``POST …/inbox/mark``, the prune and the erasure; and that the
counts never drift from the items over any sequence of writes, marks and prunes (Hypothesis).

In-process (Django test client, rolled-back transactions); items are written with
``notifications.inbox.store.write``, as the pipeline writes them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Q
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.api.scopes import Scope
from notifications.inbox import marks, prune, store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import APIAuditEntry, APIClient, Notification
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="product-backend", scopes=[Scope.INBOX])
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def alice():
    return Recipient.objects.create(user_id="alice")


@pytest.fixture
def bob():
    return Recipient.objects.create(user_id="bob")


def put(recipient, n=1, *, start=NOW - timedelta(hours=1), step=timedelta(minutes=1), category="",
        expires_at=None, ids=None) -> list[uuid.UUID]:
    """``n`` items for ``recipient``, the first at ``start`` and each ``step`` later; their ids, oldest first."""
    ids = ids or [uuid.uuid4() for _ in range(n)]
    Notification.objects.bulk_create([Notification(id=i, recipient=recipient, channel="in_app", status="sent",
                                                    body="b") for i in ids])
    store.write([store.NewItem(i, recipient.pk, "order", category, f"title {k}", f"body {k}", {"k": str(k)},
                               start + k * step, expires_at) for k, i in enumerate(ids)])
    return ids


def counts(recipient) -> dict:
    row = InboxCounts.objects.filter(pk=recipient.pk).values("total", "unread", "unseen").first()
    return row or {"total": 0, "unread": 0, "unseen": 0}


def truth(recipient) -> dict:
    live = InboxItem.objects.filter(recipient=recipient, archived_at__isnull=True)
    return {"total": live.count(), "unread": live.filter(read_at__isnull=True).count(),
            "unseen": live.filter(seen_at__isnull=True).count()}


def states() -> list[tuple]:
    return list(InboxItem.objects.order_by("pk").values_list("pk", "seen_at", "read_at", "archived_at"))


def mark(http, user, body):
    return http.post(f"/v1/users/{user}/inbox/mark", data=json.dumps(body), content_type="application/json")


def listed(http, user, **query):
    r = http.get(f"/v1/users/{user}/inbox", query)
    assert r.status_code == 200, r.content
    return r.json()


def error_fields(r) -> list[tuple[str, str]]:
    return [(f["field"], f["code"]) for f in r.json()["error"]["fields"]]


# --- listing ---------------------------------------------------------------------------------------

def test_pages_follow_the_cursor_newest_first_without_gaps_or_repeats(http, alice, frozen):
    ids = put(alice, 45)
    seen, cursor, pages = [], None, 0
    while True:
        body = listed(http, "alice", **({"cursor": cursor} if cursor else {}))
        pages += 1
        seen += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3  # 20 + 20 + 5 (default limit 20)
    assert seen == [str(i) for i in reversed(ids)]


def test_an_item_has_the_documented_shape(http, alice, frozen):
    (nid,) = put(alice, 1, category="orders", expires_at=NOW + timedelta(days=1))
    assert listed(http, "alice") == {"items": [{
        "id": str(nid), "type": "order", "category": "orders", "title": "title 0", "body": "body 0",
        "data": {"k": "0"}, "created_at": "2026-12-02T11:00:00Z", "seen_at": None, "read_at": None,
        "archived_at": None, "expires_at": "2026-12-03T12:00:00Z"}], "next_cursor": None}


def test_ties_on_created_at_are_ordered_by_id_and_pages_split_them_exactly(http, alice, frozen):
    ids = put(alice, 7, step=timedelta(0))  # all at the same instant
    first = listed(http, "alice", limit=3)
    second = listed(http, "alice", limit=3, cursor=first["next_cursor"])
    third = listed(http, "alice", limit=3, cursor=second["next_cursor"])
    got = [i["id"] for page in (first, second, third) for i in page["items"]]
    assert got == sorted(map(str, ids), reverse=True)
    assert third["next_cursor"] is None


def test_status_and_category_filters(http, alice, frozen):
    a, b, c, d = put(alice, 4)
    e = put(alice, 1, category="billing", start=NOW - timedelta(minutes=5))[0]
    assert mark(http, "alice", {"ids": [str(a)], "status": "seen"}).json() == {"changed": 1, "more": False}
    assert mark(http, "alice", {"ids": [str(b)], "status": "read"}).json() == {"changed": 1, "more": False}
    assert mark(http, "alice", {"ids": [str(c)], "status": "archived"}).json() == {"changed": 1, "more": False}

    def ids(**q):
        return [i["id"] for i in listed(http, "alice", **q)["items"]]

    assert ids() == [str(e), str(d), str(b), str(a)]  # archived c left the default list
    assert ids(status="all") == [str(e), str(d), str(b), str(a)]
    assert ids(status="unread") == [str(e), str(d), str(a)]
    assert ids(status="unseen") == [str(e), str(d)]
    assert ids(status="archived") == [str(c)]
    assert ids(category="billing") == [str(e)]
    assert ids(category="billing", status="archived") == []


def test_items_past_their_ttl_are_never_listed(http, alice, frozen):
    put(alice, 2, expires_at=NOW - timedelta(seconds=1))
    (live,) = put(alice, 1, expires_at=NOW + timedelta(seconds=1))
    assert [i["id"] for i in listed(http, "alice")["items"]] == [str(live)]
    frozen[0] = NOW + timedelta(seconds=1)  # expires_at is no longer in the future
    assert listed(http, "alice")["items"] == []


def test_another_users_items_are_not_listed(http, alice, bob, frozen):
    put(bob, 3)
    assert listed(http, "alice") == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(("query", "status", "field", "code"), [
    ({"limit": "101"}, 422, "limit", "max_value"),
    ({"limit": "0"}, 422, "limit", "min_value"),
    ({"limit": "ten"}, 422, "limit", "invalid"),
    ({"status": "read"}, 422, "status", "invalid_choice"),
    ({"category": "Not A Category"}, 422, "category", "invalid"),
    ({"colour": "red"}, 422, "colour", "unknown_parameter"),
    ({"cursor": "bm90LWEtY3Vyc29y"}, 400, "cursor", "invalid_cursor"),
])
def test_bad_query_parameters_are_refused_naming_them(http, alice, query, status, field, code):
    put(alice, 2)
    r = http.get("/v1/users/alice/inbox", query)
    assert r.status_code == status, r.content
    assert error_fields(r) == [(field, code)]


def test_a_tampered_cursor_is_400_not_a_500(http, alice, frozen):
    put(alice, 3)
    cursor = listed(http, "alice", limit=1)["next_cursor"]
    assert cursor
    for bad in (cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB"), cursor[:10], "x" * 40 + ":y"):
        r = http.get("/v1/users/alice/inbox", {"cursor": bad})
        assert r.status_code == 400, (bad, r.content)
        assert error_fields(r) == [("cursor", "invalid_cursor")]
        assert r.json()["error"]["code"] == "invalid_cursor"


def test_another_listings_cursor_is_400(http, alice, bob, frozen):
    put(alice, 3, category="orders")
    put(bob, 3, category="orders")
    cursor = listed(http, "alice", limit=1)["next_cursor"]
    assert listed(http, "alice", limit=1, cursor=cursor)["next_cursor"]  # its own listing: the next page
    for user, query in (("bob", {}), ("alice", {"status": "unread"}), ("alice", {"category": "orders"})):
        r = http.get(f"/v1/users/{user}/inbox", {"cursor": cursor, **query})
        assert r.status_code == 400, (user, query, r.content)
        assert error_fields(r) == [("cursor", "invalid_cursor")]


@pytest.mark.parametrize("later", [1, 2, 59, 3600, 30 * 86400])
def test_a_cursor_still_reads_the_next_page_after_the_clock_moved(http, alice, bob, frozen, host_clock, later):
    # Issue 23 #1: the salt was signing.dumps(...), stamped with the current second, so a cursor
    # used a second later no longer verified ("load more" was 400 invalid_cursor).
    ids = put(alice, 3, category="orders")
    first = listed(http, "alice", limit=2, category="orders", status="unread")
    host_clock[0] += later
    frozen[0] += timedelta(seconds=later)
    second = listed(http, "alice", limit=2, category="orders", status="unread", cursor=first["next_cursor"])
    assert [i["id"] for i in first["items"] + second["items"]] == [str(i) for i in reversed(ids)]
    assert second["next_cursor"] is None
    # ... and it is still this listing's only: another user's, status's or category's is 400.
    for user, query in (("bob", {"category": "orders", "status": "unread"}), ("alice", {"category": "orders"}),
                        ("alice", {"status": "unread"})):
        r = http.get(f"/v1/users/{user}/inbox", {"cursor": first["next_cursor"], **query})
        assert r.status_code == 400, (user, query, r.content)
        assert error_fields(r) == [("cursor", "invalid_cursor")]


def test_limit_100_is_allowed(http, alice, frozen):
    put(alice, 101)
    body = listed(http, "alice", limit=100)
    assert len(body["items"]) == 100 and body["next_cursor"] is not None


# --- counts ----------------------------------------------------------------------------------------

def test_counts_are_zero_without_an_inbox_and_follow_writes(http, alice, frozen):
    assert http.get("/v1/users/alice/inbox/counts").json() == {"unseen": 0, "unread": 0, "total": 0}
    ids = put(alice, 3)
    # The pipeline re-driving a written row: one item, counted once.
    assert store.write([store.NewItem(ids[0], alice.pk, "order", "", "t", "b", None, NOW, None)]) == set()
    assert http.get("/v1/users/alice/inbox/counts").json() == {"unseen": 3, "unread": 3, "total": 3}


# --- mark ------------------------------------------------------------------------------------------

def test_seen_then_read_then_unread_then_archived_moves_the_counts_exactly(http, alice, frozen):
    a, b = put(alice, 2)

    def badge():
        return http.get("/v1/users/alice/inbox/counts").json()

    assert mark(http, "alice", {"ids": [str(a)], "status": "seen"}).json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 1, "unread": 2, "total": 2}
    assert mark(http, "alice", {"ids": [str(a)], "status": "read"}).json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 1, "unread": 1, "total": 2}
    frozen[0] = NOW + timedelta(minutes=5)
    assert mark(http, "alice", {"ids": [str(a)], "status": "unread"}).json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 1, "unread": 2, "total": 2}
    item = InboxItem.objects.get(pk=a)
    assert (item.seen_at, item.read_at) == (NOW, None)  # unread leaves seen
    assert mark(http, "alice", {"ids": [str(b)], "status": "read"}).json() == {"changed": 1, "more": False}
    item = InboxItem.objects.get(pk=b)
    assert (item.seen_at, item.read_at) == (NOW + timedelta(minutes=5),) * 2  # read implies seen
    assert badge() == {"unseen": 0, "unread": 1, "total": 2}
    assert mark(http, "alice", {"ids": [str(a)], "status": "archived"}).json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 0, "unread": 0, "total": 1}  # the archived item leaves all three
    assert counts(alice) == truth(alice)


def test_marks_are_idempotent_and_monotonic(http, alice, frozen):
    (a,) = put(alice, 1)
    for status in ("seen", "read", "archived"):
        assert mark(http, "alice", {"ids": [str(a)], "status": status}).json() == {"changed": 1, "more": False}
        before = states()
        frozen[0] += timedelta(minutes=1)
        assert mark(http, "alice", {"ids": [str(a)], "status": status}).json() == {"changed": 0, "more": False}
        assert states() == before  # the timestamps did not move later
    item = InboxItem.objects.get(pk=a)
    assert (item.seen_at, item.read_at, item.archived_at) == (NOW, NOW + timedelta(minutes=1),
                                                              NOW + timedelta(minutes=2))
    assert mark(http, "alice", {"ids": [str(a)], "status": "unread"}).json() == {"changed": 1, "more": False}
    assert mark(http, "alice", {"ids": [str(a)], "status": "unread"}).json() == {"changed": 0, "more": False}
    assert counts(alice) == truth(alice) == {"total": 0, "unread": 0, "unseen": 0}


def test_all_before_marks_items_created_at_or_before_the_instant(http, alice, frozen):
    ids = put(alice, 5)  # 11:00, 11:01, … 11:04
    r = mark(http, "alice", {"all_before": "2026-12-02T11:02:00Z", "status": "read"})
    assert r.json() == {"changed": 3, "more": False}
    read = set(InboxItem.objects.filter(read_at__isnull=False).values_list("pk", flat=True))
    assert read == set(ids[:3])
    assert counts(alice) == {"total": 5, "unread": 2, "unseen": 2}
    again = mark(http, "alice", {"all_before": "2026-12-02T12:00:00+01:00", "status": "read"})
    assert again.json() == {"changed": 0, "more": False}


def test_all_before_changes_at_most_a_bounded_number_per_call_newest_first_and_says_more(http, alice, frozen,
                                                                                      monkeypatch):
    monkeypatch.setattr(marks, "MAX_PER_CALL", 2)
    ids = put(alice, 5)  # 11:00 … 11:04
    body = {"all_before": "2026-12-02T11:03:00Z", "status": "seen"}  # four of them
    assert mark(http, "alice", body).json() == {"changed": 2, "more": True}
    assert set(InboxItem.objects.filter(seen_at__isnull=False).values_list("pk", flat=True)) == {ids[3], ids[2]}
    assert mark(http, "alice", body).json() == {"changed": 2, "more": True}
    assert mark(http, "alice", body).json() == {"changed": 0, "more": False}
    assert set(InboxItem.objects.filter(seen_at__isnull=True).values_list("pk", flat=True)) == {ids[4]}
    assert counts(alice) == {"total": 5, "unread": 5, "unseen": 1}


def test_foreign_or_unknown_ids_are_404_listing_them_and_nothing_changes(http, alice, bob, frozen):
    (mine,) = put(alice, 1)
    (theirs,) = put(bob, 1)
    unknown = uuid.uuid4()
    before, badge = states(), (counts(alice), counts(bob))
    r = mark(http, "alice", {"ids": [str(mine), str(theirs), str(unknown)], "status": "read"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["fields"] == [
        {"field": "ids.1", "code": "not_found", "message": f"no inbox item {theirs} of this user"},
        {"field": "ids.2", "code": "not_found", "message": f"no inbox item {unknown} of this user"}]
    assert str(theirs) in r.json()["error"]["message"] and str(unknown) in r.json()["error"]["message"]
    assert states() == before and (counts(alice), counts(bob)) == badge


@pytest.mark.parametrize(("body", "expected"), [
    ({"status": "read"}, [("ids", "one_of")]),
    ({"ids": [], "status": "read"}, [("ids", "min_length")]),
    ({"ids": ["x"], "status": "read"}, [("ids.0", "invalid")]),
    ({"all_before": "2026-12-02T11:00:00", "status": "read"}, [("all_before", "naive_datetime")]),
    ({"all_before": "2026-12-02T11:00:00Z", "ids": [], "status": "read"}, [("ids", "min_length")]),
    ({"all_before": "2026-12-02T11:00:00Z"}, [("status", "required")]),
    ({"all_before": "2026-12-02T11:00:00Z", "status": "deleted"}, [("status", "invalid_choice")]),
    ({"all_before": "2026-12-02T11:00:00Z", "status": "read", "force": True}, [("force", "unknown_field")]),
])
def test_a_bad_mark_is_422_naming_the_field_and_changes_nothing(http, alice, body, expected, frozen):
    put(alice, 2)
    before = states()
    r = mark(http, "alice", body)
    assert r.status_code == 422, r.content
    assert error_fields(r) == expected
    assert states() == before


def test_both_ids_and_all_before_is_422(http, alice, frozen):
    (a,) = put(alice, 1)
    r = mark(http, "alice", {"ids": [str(a)], "all_before": "2026-12-02T11:00:00Z", "status": "read"})
    assert (r.status_code, error_fields(r)) == (422, [("ids", "one_of")])


def test_more_than_1000_ids_is_422(http, alice, frozen):
    r = mark(http, "alice", {"ids": [str(uuid.uuid4()) for _ in range(1001)], "status": "read"})
    assert (r.status_code, error_fields(r)) == (422, [("ids", "max_length")])


def test_every_mark_is_in_the_audit_log(http, alice, frozen):
    (a,) = put(alice, 1)
    mark(http, "alice", {"ids": [str(a)], "status": "read"})
    mark(http, "alice", {"ids": [str(uuid.uuid4())], "status": "read"})
    entries = list(APIAuditEntry.objects.order_by("id").values_list("method", "path", "object_type", "object_id",
                                                                    "status", "fields"))
    assert entries == [("POST", "/v1/users/alice/inbox/mark", "inbox", "alice", 200, ["read_at", "seen_at"]),
                       ("POST", "/v1/users/alice/inbox/mark", "inbox", "alice", 404, [])]


# --- who may call ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path"), [("get", "/v1/users/nobody/inbox"),
                                              ("get", "/v1/users/nobody/inbox/counts"),
                                              ("post", "/v1/users/nobody/inbox/mark")])
def test_an_unknown_user_is_404_on_all_three(http, method, path):
    body = {"all_before": "2026-12-02T11:00:00Z", "status": "read"}
    r = (http.get(path) if method == "get" else
         http.post(path, data=json.dumps(body), content_type="application/json"))
    assert r.status_code == 404
    assert error_fields(r) == [("user_id", "not_found")]


@pytest.mark.parametrize(("method", "path"), [("get", "/v1/users/alice/inbox"),
                                              ("get", "/v1/users/alice/inbox/counts"),
                                              ("post", "/v1/users/alice/inbox/mark")])
def test_without_the_inbox_scope_it_is_403_even_with_every_other_scope(alice, method, path):
    (a,) = put(alice, 1)
    _, key = APIClient.objects.create_key(name="other", scopes=[s for s in Scope.values if s != Scope.INBOX])
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    body = {"ids": [str(a)], "status": "read"}
    r = (http.get(path) if method == "get" else
         http.post(path, data=json.dumps(body), content_type="application/json"))
    assert r.status_code == 403
    assert error_fields(r) == [("Authorization", "missing_scope")]
    assert InboxItem.objects.get(pk=a).read_at is None


def test_the_inbox_scope_is_not_a_default():
    from core.api.scopes import DEFAULT_SCOPES

    assert Scope.INBOX not in DEFAULT_SCOPES


# --- prune and erasure -----------------------------------------------------------------------------

def test_prune_deletes_expired_and_retired_items_and_moves_the_counts(alice, bob, settings, frozen):
    settings.NOTIFY = {**settings.NOTIFY, "INBOX": {**settings.NOTIFY["INBOX"], "RETENTION_DAYS": 30,
                                                   "PRUNE_BATCH": 2}}
    expired = put(alice, 2, expires_at=NOW - timedelta(seconds=1))
    old = put(alice, 1, start=NOW - timedelta(days=31))
    keep = put(alice, 1, start=NOW - timedelta(days=29), expires_at=NOW + timedelta(hours=1))
    bobs_old = put(bob, 1, start=NOW - timedelta(days=40))
    marks.mark(alice.pk, "read", ids=[expired[0]], now=NOW - timedelta(seconds=2))  # before it expired
    assert counts(alice) == truth(alice) == {"total": 4, "unread": 3, "unseen": 3}
    assert prune.prune_batch() == 2
    assert prune.prune() == 2  # one batch of 2, then a short one of 0
    assert set(InboxItem.objects.values_list("pk", flat=True)) == set(keep)
    assert not set(InboxItem.objects.values_list("pk", flat=True)) & set(expired + old + bobs_old)
    assert counts(alice) == truth(alice) == {"total": 1, "unread": 1, "unseen": 1}
    assert counts(bob) == truth(bob) == {"total": 0, "unread": 0, "unseen": 0}
    assert prune.prune() == 0


def test_prune_takes_archived_items_without_touching_counts(alice, frozen):
    a, _b = put(alice, 2, expires_at=NOW - timedelta(seconds=1))
    marks.mark(alice.pk, "archived", ids=[a], now=NOW - timedelta(seconds=2))
    assert counts(alice) == {"total": 1, "unread": 1, "unseen": 1}
    assert prune.prune() == 2
    assert counts(alice) == {"total": 0, "unread": 0, "unseen": 0}


def test_the_beat_runs_the_prune_on_the_maintenance_queue(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["prune-inbox"]
    assert entry["task"] == "notifications.prune_inbox"
    assert entry["schedule"] == float(settings.NOTIFY["INBOX"]["PRUNE_EVERY_SECONDS"])
    assert entry["options"]["queue"] == "maintenance"
    from celery import current_app

    import notifications.tasks  # noqa: F401 (registers the task)
    assert "notifications.prune_inbox" in current_app.tasks


def test_erasure_deletes_the_users_inbox_and_counts_and_no_one_elses(alice, bob, frozen):
    _, key = APIClient.objects.create_key(name="users", scopes=[Scope.RECIPIENTS_WRITE])
    put(alice, 3)
    bobs = put(bob, 2)
    r = Client(headers={"Authorization": f"Api-Key {key}"}).delete("/v1/users/alice")
    assert r.status_code == 200, r.content
    assert not InboxItem.objects.filter(recipient=alice).exists()
    assert not InboxCounts.objects.filter(pk=alice.pk).exists()
    assert set(InboxItem.objects.values_list("pk", flat=True)) == set(bobs)
    assert counts(bob) == {"total": 2, "unread": 2, "unseen": 2}


# --- the badge never drifts ------------------------------------------------------------------------

_OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 3), st.booleans()),  # n new items, expired or not
    st.tuples(st.just("rewrite"), st.integers(0, 20)),  # the pipeline re-drives a written item
    st.tuples(st.sampled_from(["seen", "read", "unread", "archived"]),
              st.lists(st.integers(0, 20), min_size=1, max_size=4, unique=True)),
    st.tuples(st.just("before"), st.sampled_from(["seen", "read", "unread", "archived"]), st.integers(0, 12)),
    st.tuples(st.just("prune"),),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(ops=st.lists(_OPS, min_size=1, max_size=12))
def test_counts_always_equal_the_counts_of_the_items(ops):
    user = Recipient.objects.create(user_id=f"h-{uuid.uuid4().hex}")
    written: list[uuid.UUID] = []
    clock_at = NOW
    for op in ops:
        clock_at += timedelta(minutes=1)
        if op[0] == "write":
            written += put(user, op[1], start=clock_at, step=timedelta(seconds=1),
                           expires_at=clock_at - timedelta(seconds=1) if op[2] else None)
        elif op[0] == "rewrite" and written:
            nid = written[op[1] % len(written)]
            if InboxItem.objects.filter(pk=nid).exists():
                assert store.write([store.NewItem(nid, user.pk, "", "", "t", "b", None, clock_at, None)]) == set()
        elif op[0] in marks.STATUSES and written:
            ids = list(dict.fromkeys(written[i % len(written)] for i in op[1]))
            present = set(InboxItem.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=clock_at),
                                                   pk__in=ids).values_list("pk", flat=True))  # listed ones
            before = states()
            try:
                marks.mark(user.pk, op[0], ids=ids, now=clock_at)
                assert present == set(ids)
            except marks.UnknownItems as exc:
                assert set(exc.ids) == set(ids) - present
                assert states() == before  # all-or-nothing
        elif op[0] == "before":
            marks.mark(user.pk, op[1], all_before=NOW + timedelta(minutes=op[2]), now=clock_at)
        elif op[0] == "prune":
            prune.prune(now=clock_at)
        assert counts(user) == truth(user), op


def test_marks_by_id_are_the_app_receipts_of_their_notifications_and_all_before_is_not(http, alice, frozen):
    a, b, c, d = put(alice, 4)
    assert mark(http, "alice", {"ids": [str(a)], "status": "seen"}).json()["changed"] == 1
    assert mark(http, "alice", {"ids": [str(b)], "status": "read"}).json()["changed"] == 1
    assert mark(http, "alice", {"ids": [str(b)], "status": "unread"}).json()["changed"] == 1
    assert mark(http, "alice", {"ids": [str(b)], "status": "read"}).json()["changed"] == 1  # read again: no 2nd entry
    assert mark(http, "alice", {"ids": [str(c)], "status": "archived"}).json()["changed"] == 1
    assert mark(http, "alice", {"all_before": NOW.isoformat(), "status": "read"}).json()["changed"] == 3

    status = dict(Notification.objects.values_list("pk", "status"))
    assert (status[a], status[b], status[c], status[d]) == ("displayed", "opened", "dismissed", "sent")
    kinds = {n: list(Notification.objects.get(pk=n).events.values_list("kind", flat=True)) for n in (a, b, c, d)}
    assert kinds == {a: ["app_displayed"], b: ["app_opened"], c: ["app_dismissed"], d: []}


def test_instants_with_any_offset_python_accepts_are_taken_and_out_of_range_ones_are_422(http, alice, frozen):
    """Python parses offsets up to ±23:59, Postgres stops at ±15:59: the field hands on UTC."""
    put(alice, 2)  # 11:00, 11:01 UTC
    assert mark(http, "alice", {"all_before": "2026-12-03T03:00:30+16:00", "status": "seen"}).json() == {
        "changed": 1, "more": False}  # 11:00:30 UTC
    r = mark(http, "alice", {"all_before": "0001-01-01T00:00:00+23:00", "status": "seen"})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "all_before", "code": "out_of_range",
                                            "message": "its UTC instant is outside the years 1–9999"}]
    assert counts(alice) == {"total": 2, "unread": 2, "unseen": 1}


def test_an_item_past_its_ttl_cannot_be_marked_by_id(http, alice, frozen):
    (gone,) = put(alice, 1, expires_at=NOW - timedelta(seconds=1))
    r = mark(http, "alice", {"ids": [str(gone)], "status": "read"})
    assert r.status_code == 404 and error_fields(r) == [("ids.0", "not_found")]
    assert InboxItem.objects.get(pk=gone).read_at is None
    assert Notification.objects.get(pk=gone).status == "sent"


def test_a_large_mark_by_ids_goes_to_the_receipts_worker_and_the_task_applies_it(http, alice, frozen, monkeypatch,
                                                                                settings):
    from notifications import app_receipts, tasks

    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    published = []
    monkeypatch.setattr(app_receipts.current_app, "send_task", lambda name, **kw: published.append((name, kw)))
    ids = put(alice, app_receipts.INBOX_MARK_INLINE + 1)
    assert mark(http, "alice", {"ids": [str(i) for i in ids], "status": "read"}).json()["changed"] == len(ids)
    assert Notification.objects.filter(status="opened").count() == 0  # not in the request
    ((name, kw),) = published
    assert (name, kw["queue"], sorted(kw["args"][0]), kw["args"][1]) == (
        "notifications.inbox_mark_receipts", "receipts", sorted(str(i) for i in ids), "read")

    assert tasks.inbox_mark_receipts(*kw["args"]) == len(ids)
    assert Notification.objects.filter(status="opened").count() == len(ids)


def test_an_in_app_receipt_marks_its_item_and_moves_the_badge(alice, frozen):
    from notifications.app_receipts import apply_app_receipt

    a, b, c = put(alice, 3)
    apply_app_receipt(Notification.objects.filter(pk=a), "displayed")
    apply_app_receipt(Notification.objects.filter(pk=b), "opened")
    apply_app_receipt(Notification.objects.filter(pk=c), "dismissed")
    state = {i.pk: (i.seen_at is not None, i.read_at is not None, i.archived_at is not None)
             for i in InboxItem.objects.filter(recipient=alice)}
    assert state == {a: (True, False, False), b: (True, True, False), c: (False, False, True)}
    assert counts(alice) == truth(alice) == {"total": 2, "unread": 1, "unseen": 0}
    apply_app_receipt(Notification.objects.filter(pk=b), "displayed")  # later and lower: nothing moves
    assert counts(alice) == {"total": 2, "unread": 1, "unseen": 0}


@pytest.mark.parametrize(("content", "field"), [
    ({"title": "Sale \x1b[31mnow", "body": "b"}, "content.title"),
    ({"title": "Hi\nthere", "body": "b"}, "content.title"),
    ({"body": "pay \u202egnp.exe"}, "content.body"),
    ({"body": "ring \x07"}, "content.body"),
])
def test_an_in_app_send_with_a_control_or_bidi_override_character_is_422_and_writes_nothing(alice, content, field):
    _, key = APIClient.objects.create_key(name="sender", scopes=[Scope.SEND])
    r = Client(headers={"Authorization": f"Api-Key {key}"}).post(
        "/v1/notifications", data=json.dumps({"user_id": "alice", "channel": "in_app", "content": content}),
        content_type="application/json", headers={"Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 422, r.content
    assert error_fields(r) == [(field, "control_character")]
    assert Notification.objects.count() == 0


def test_line_breaks_tabs_and_right_to_left_marks_are_fine_in_an_in_app_body(alice):
    _, key = APIClient.objects.create_key(name="sender", scopes=[Scope.SEND])
    r = Client(headers={"Authorization": f"Api-Key {key}"}).post(
        "/v1/notifications", data=json.dumps({"user_id": "alice", "channel": "in_app", "content": {
            "title": "שלום\u200f", "body": "line 1\nline 2\ttabbed"}}),
        content_type="application/json", headers={"Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 202, r.content

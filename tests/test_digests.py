"""Digests in-process (docs/TYPES.md, "Digests"): which events share a digest (concurrent events of
one key, keys that never merge, window boundaries against a model), closing (one notification per
channel, once), what the API answers and refuses, and the send-time content with ``items`` and
``count`` and the type's collapse key (against the module's emulator subprocess).

Committed rows (``transaction=True``): the threads and the pipeline use their own connections."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import clock
from notifications import scheduler
from notifications.delivery.pipeline import send_notifications
from notifications.events import digests, services
from notifications.events.models import Digest, DigestItem, NotificationType, TypeTemplate
from notifications.ids import digest_notification_id
from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_typed_delivery import providers  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
WINDOW = 60


@pytest.fixture
def client():
    return APIClient.objects.create_key(name=f"digest-{uuid.uuid4().hex[:6]}")[0]


@pytest.fixture
def at(monkeypatch):
    """The platform clock stands at ``at[0]`` (starts at T0)."""
    current = [T0]
    monkeypatch.setattr(clock, "now", lambda: current[0])
    return current


def likes_type(key: str | None = None, channels=("push",), digest_key="{{ data.post_id }}", **over) -> NotificationType:
    kind = NotificationType.objects.create(
        key=key or f"likes_{uuid.uuid4().hex[:6]}", name="Likes", category="social", channels=list(channels),
        digest={"window_seconds": WINDOW, "key": digest_key}, **over)
    for channel in channels:
        TypeTemplate.objects.create(type=kind, channel=channel, locale="en", title="Your post {{ data.post_id }}",
                                    body="{{ items[0].actor }} and {{ count - 1 }} others liked your post")
    return kind


def a_user(devices: int = 1) -> Recipient:
    tag = uuid.uuid4().hex[:8]
    r = Recipient.objects.create(user_id=f"d-{tag}", email=f"{tag}@example.org")
    for i in range(devices):
        Device.objects.create(recipient=r, platform="ios", push_token=f"tok-{tag}-{i}")
    return r


def accept(client, kind, recipient, data) -> services.AcceptedEvent:
    return services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                                 recipients=[recipient], data=data)


def items_of(digest: Digest) -> list[str]:
    return [i.event.data["actor"] for i in DigestItem.objects.filter(digest=digest).select_related("event")]


def test_five_events_accepted_at_once_make_one_digest_of_five_items(client, at):
    kind, r = likes_type(), a_user()
    start = threading.Barrier(5)
    accepted, errors = [], []

    def one(actor: str) -> None:
        try:
            start.wait()
            accepted.append(accept(client, kind, r, {"post_id": "p1", "actor": actor}))
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(f"a{i}",)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    (digest,) = Digest.objects.filter(type=kind, recipient=r)
    assert (digest.key, digest.state, digest.closes_at) == ("p1", "open", T0 + timedelta(seconds=WINDOW))
    assert sorted(items_of(digest)) == ["a0", "a1", "a2", "a3", "a4"]
    assert {a.digests[0].pk for a in accepted} == {digest.pk}
    assert all(a.notifications == [] for a in accepted)
    assert Notification.objects.filter(recipient=r).count() == 0  # nothing before the window closes


def test_keys_a_b_a_b_make_two_digests_of_two_that_each_close_into_one_notification_per_channel(client, at):
    kind, r = likes_type(channels=("push", "email")), a_user()
    for post, actor in [("A", "x1"), ("B", "y1"), ("A", "x2"), ("B", "y2")]:
        accept(client, kind, r, {"post_id": post, "actor": actor})
        at[0] += timedelta(seconds=1)
    assert digests.close_due() == 0  # windows still open

    at[0] = T0 + timedelta(seconds=WINDOW)
    assert digests.close_due() == 1  # A's window (from T0) has ended; B's (from T0 + 1 s) not yet
    at[0] += timedelta(seconds=1)
    assert digests.close_due() == 1
    by_key = {d.key: d for d in Digest.objects.filter(type=kind, recipient=r)}
    assert sorted(by_key) == ["A", "B"]
    assert (items_of(by_key["A"]), items_of(by_key["B"])) == (["x1", "x2"], ["y1", "y2"])
    rows = Notification.objects.filter(recipient=r).order_by("digest__key", "channel")
    assert [(n.digest.key, n.channel, n.status, n.due_at, str(n.pk)) for n in rows] == [
        (key, channel, "scheduled", T0 + timedelta(seconds=WINDOW + (key == "B")),
         str(digest_notification_id(by_key[key].pk, channel))) for key in ("A", "B") for channel in ("email", "push")]
    assert [d.item_count for d in by_key.values()] == [2, 2]
    assert set(DeliveryEvent.objects.filter(notification__recipient=r).values_list("kind", "detail")) == {
        ("accepted", f"digest of 2 event(s) of type {kind.key}, key {k}; released by the scheduler") for k in "AB"}

    at[0] += timedelta(seconds=5)
    assert digests.close_due() == 0  # nothing left to close; closing again inserts nothing
    for digest in by_key.values():
        assert digests.close(digest, at[0]) == []
    assert Notification.objects.filter(recipient=r).count() == 4


def test_an_event_after_the_window_closes_the_old_digest_and_opens_a_new_one(client, at):
    kind, r = likes_type(), a_user()
    accept(client, kind, r, {"post_id": "p", "actor": "a"})
    at[0] = T0 + timedelta(seconds=WINDOW)  # the window has ended; the scheduler has not run yet
    later = accept(client, kind, r, {"post_id": "p", "actor": "b"})

    old, new = Digest.objects.filter(type=kind, recipient=r).order_by("opened_at")
    assert (old.state, old.closed_at, items_of(old)) == ("closed", at[0], ["a"])
    assert (new.state, new.opened_at, items_of(new), later.digests) == ("open", at[0], ["b"], [new])
    assert list(Notification.objects.filter(recipient=r).values_list("pk", flat=True)) == [
        digest_notification_id(old.pk, "push")]


def test_an_empty_key_is_one_digest_per_user_and_type_and_users_never_share_one(client, at):
    kind, r1, r2 = likes_type(digest_key=""), a_user(), a_user()
    first = services.accept_event(client=client, idempotency_key="k1", fingerprint="f", kind=kind,
                                  recipients=[r2, r1], data={"post_id": "A", "actor": "a"})
    replay = services.accept_event(client=client, idempotency_key="k1", fingerprint="f", kind=kind,
                                   recipients=[r2, r1], data={"post_id": "A", "actor": "a"})
    assert replay.replayed and [d.recipient_id for d in replay.digests] == [r2.pk, r1.pk]
    assert [d.pk for d in replay.digests] == [d.pk for d in first.digests]
    accept(client, kind, r1, {"post_id": "B", "actor": "b"})
    (d1,), (d2,) = Digest.objects.filter(recipient=r1), Digest.objects.filter(recipient=r2)
    assert (d1.key, items_of(d1), items_of(d2)) == ("", ["a", "b"], ["a"])


# --- which events share a digest: a model over generated sequences ---------------------------------------------

def model_groups(events: list[tuple[str, int]]) -> list[int]:
    """For events ``(key, seconds after T0)`` in acceptance order: the index of the first event of the
    digest each one joins. An event joins the open digest of its key when it arrives before that
    digest's first event + WINDOW; otherwise it opens a new one."""
    open_since: dict[str, tuple[int, int]] = {}
    out = []
    for index, (key, t) in enumerate(events):
        current = open_since.get(key)
        if current is None or t >= current[1] + WINDOW:
            current = open_since[key] = (index, t)
        out.append(current[0])
    return out


#: Seconds between events: often just before, at and just after a window's end.
GAPS = st.one_of(st.sampled_from([0, 1, WINDOW - 1, WINDOW, WINDOW + 1]), st.integers(0, 2 * WINDOW))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from("ABC"), GAPS), min_size=1, max_size=8),
       st.sets(st.integers(0, 7)))
def test_events_share_a_digest_exactly_as_the_model_says(client, at, steps, beats):
    """``steps``: (key, seconds since the previous event); ``beats``: after which events the scheduler
    runs (closing what has ended): it never changes which events share a digest."""
    kind, r = likes_type(key=f"h_{uuid.uuid4().hex[:8]}"), a_user(devices=0)
    events, t = [], 0
    joined = []
    for index, (key, gap) in enumerate(steps):
        t += gap
        at[0] = T0 + timedelta(seconds=t)
        events.append((key, t))
        joined.append(accept(client, kind, r, {"post_id": key, "actor": str(index)}).digests[0].pk)
        if index in beats:
            digests.close_due()
    at[0] = T0 + timedelta(seconds=t + WINDOW)
    digests.close_due()

    first_of = model_groups(events)
    assert [joined[i] for i in first_of] == joined  # each event is in the digest of its group's first
    assert len(set(joined)) == len(set(first_of))  # and different groups are different digests
    found = Digest.objects.filter(type=kind)
    assert all(d.closed_at is not None for d in found)
    assert sorted(d.item_count for d in found) == sorted(first_of.count(i) for i in set(first_of))
    assert Notification.objects.filter(digest__type=kind).count() == len(set(first_of))


# --- the API ---------------------------------------------------------------------------------------------------

def http_for(name: str) -> Client:
    _client, key = APIClient.objects.create_key(name=name, scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


def type_body(**over) -> dict:
    return {"name": "Likes", "category": "social", "channels": ["push"],
            "digest": {"window_seconds": 600, "key": "{{ data.post_id }}"},
            "templates": [{"channel": "push", "locale": "en",
                           "body": "{{ items[0].actor }} and {{ count - 1 }} others liked your post"}], **over}


def put(http, key, body):
    return http.put(f"/v1/notification-types/{key}", data=json.dumps(body), content_type="application/json")


def fields(resp) -> dict:
    return {f["field"]: f["code"] for f in resp.json()["error"]["fields"]}


@pytest.mark.parametrize(("digest", "over", "field", "code"), [
    ({"window_seconds": 59}, {}, "digest.window_seconds", "min_value"),
    ({"window_seconds": 86_401}, {}, "digest.window_seconds", "max_value"),
    ({"key": "p"}, {}, "digest.window_seconds", "required"),
    ({"window_seconds": "soon"}, {}, "digest.window_seconds", "invalid_type"),
    ({"window_seconds": 600, "key": "{{ data.post_id "}, {}, "digest.key", "template_syntax"),
    ({"window_seconds": 600, "key": "{{ range(10**6) }}"}, {}, "digest.key", "render_bound"),
    ({"window_seconds": 600, "key": '{% include "/etc/passwd" %}'}, {}, "digest.key", "template_syntax"),
    ({"window_seconds": 600, "key": "{{ user_id }}"}, {}, "digest.key", "unknown_variable"),
    ({"window_seconds": 600, "key": "{{ lipsum.__globals__ }}"}, {}, "digest.key", "unknown_variable"),
    ({"window_seconds": 600, "every": 5}, {}, "digest.every", "unknown_field"),
    ({"window_seconds": 600}, {"priority": "high"}, "digest", "high_not_digest"),
])
def test_a_bad_digest_is_refused_naming_the_field_and_nothing_is_written(digest, over, field, code):
    http = http_for(f"t-{uuid.uuid4().hex[:6]}")
    r = put(http, "likes_bad", type_body(digest=digest, **over))
    assert (r.status_code, fields(r)) == (422, {field: code}), r.content
    assert not NotificationType.objects.filter(pk="likes_bad").exists()


def test_the_api_defines_a_digest_type_and_an_event_says_which_digest_it_went_into(at):
    http = http_for(f"t-{uuid.uuid4().hex[:6]}")
    created = put(http, "likes_api", type_body())
    assert created.status_code == 201, created.content
    assert created.json()["digest"] == {"window_seconds": 600, "key": "{{ data.post_id }}"}
    r = a_user()
    post = http.post("/v1/events", data=json.dumps({"type": "likes_api", "user_id": r.pk,
                                                    "data": {"post_id": "p9", "actor": "Ada"}}),
                     content_type="application/json", headers={"Idempotency-Key": "like-1"})
    assert post.status_code == 202, post.content
    again = http.post("/v1/events", data=json.dumps({"type": "likes_api", "user_id": r.pk,
                                                     "data": {"post_id": "p9", "actor": "Ada"}}),
                      content_type="application/json", headers={"Idempotency-Key": "like-1"})
    assert (again.json(), again.headers["Idempotent-Replayed"]) == (post.json(), "true")
    (digest,) = Digest.objects.filter(recipient=r)
    assert DigestItem.objects.filter(digest=digest).count() == 1
    assert post.json()["notifications"] == []
    assert post.json()["digests"] == [{"id": str(digest.pk), "user_id": r.pk, "key": "p9",
                                       "closes_at": "2026-03-02T12:10:00Z"}]
    story = http.get(f"/v1/events/{post.json()['id']}").json()
    (recipient,) = story["recipients"]
    assert (recipient["outcome"], recipient["notifications"]) == ("pending", [])
    assert story["summary"] == {"users": 1, "outcomes": {"reached": 0, "pending": 1, "not_reached": 0, "unknown": 0},
                                "channels": {}}
    assert recipient["digest"] == {"id": str(digest.pk), "key": "p9", "state": "open",
                                   "opened_at": "2026-03-02T12:00:00Z", "closes_at": "2026-03-02T12:10:00Z",
                                   "closed_at": None, "items": 1}

    at[0] = T0 + timedelta(seconds=600)
    digests.close_due()
    story = http.get(f"/v1/events/{post.json()['id']}").json()
    (recipient,) = story["recipients"]
    assert (recipient["digest"]["state"], recipient["outcome"]) == ("closed", "pending")
    assert [(n["id"], n["channel"], n["status"]) for n in recipient["notifications"]] == [
        (str(digest_notification_id(digest.pk, "push")), "push", "scheduled")]
    assert (story["summary"]["outcomes"]["pending"], story["summary"]["channels"]) == (1, {"push": {"scheduled": 1}})


@pytest.mark.parametrize(("extra", "field"), [({"scheduled_at": "tomorrow"}, "scheduled_at"),
                                              ({"ttl_seconds": 60}, "ttl_seconds"),
                                              ({"collapse_key": "x"}, "collapse_key")])
def test_an_event_of_a_digest_type_refuses_its_own_timing_and_collapse_key(extra, field):
    http = http_for(f"t-{uuid.uuid4().hex[:6]}")
    assert put(http, "likes_own", type_body()).status_code == 201
    if extra.get("scheduled_at") == "tomorrow":
        extra = {"scheduled_at": (datetime.now(UTC) + timedelta(days=1)).isoformat()}
    r = a_user()
    post = http.post("/v1/events", data=json.dumps({"type": "likes_own", "user_id": r.pk, **extra,
                                                    "data": {"post_id": "p", "actor": "a"}}),
                     content_type="application/json", headers={"Idempotency-Key": "e1"})
    assert (post.status_code, fields(post)) == (422, {field: "digest_type"})
    assert not Digest.objects.filter(recipient=r).exists()


def test_a_digest_key_that_fails_on_the_events_data_is_a_422_on_data_and_nothing_is_written():
    http = http_for(f"t-{uuid.uuid4().hex[:6]}")
    assert put(http, "likes_div", type_body(digest={"window_seconds": 600, "key": "{{ 1 / data.n }}"})
               ).status_code == 201
    r = a_user()
    post = http.post("/v1/events", data=json.dumps({"type": "likes_div", "user_id": r.pk, "data": {"n": 0}}),
                     content_type="application/json", headers={"Idempotency-Key": "e1"})
    assert (post.status_code, fields(post)) == (422, {"data": "digest_key"})
    assert not Digest.objects.filter(recipient=r).exists()


# --- send time ---------------------------------------------------------------------------------------------------

def test_a_digest_is_sent_once_with_the_count_and_the_types_collapse_key(providers, module_emulator, client,  # noqa: F811
                                                                         at):
    kind = likes_type(collapse_key="post-{{ data.post_id }}")
    r = a_user()
    for actor in ("Ada", "Bo", "Cy"):
        accept(client, kind, r, {"post_id": "p7", "actor": actor})
    at[0] = T0 + timedelta(seconds=WINDOW)
    scheduler.release_due()  # closes the digest and releases its row
    (n,) = Notification.objects.filter(recipient=r)
    assert n.status == "queued"

    send_notifications([str(n.pk)])

    (message,) = module_emulator.messages()
    assert (message["title"], message["body"]) == ("Your post p7", "Ada and 2 others liked your post")
    assert message["details"]["message"]["apns"]["headers"]["apns-collapse-id"] == "post-p7"
    assert message["details"]["message"]["android"]["collapse_key"] == "post-p7"
    assert Notification.objects.get(pk=n.pk).status == "sent"


# --- the admin ---------------------------------------------------------------------------------------------------

def test_support_reads_a_digest_in_the_admin_list_and_on_its_events_page(client, at):
    import importlib

    from django.apps import apps
    from django.contrib.auth.models import Group, User
    from django.urls import reverse

    from campaigns import roles

    importlib.import_module(roles.MIGRATION).sync(apps, "default")  # the groups (a transactional test flushes)

    kind, r = likes_type(), a_user()
    first = accept(client, kind, r, {"post_id": "p3", "actor": "a"})
    accept(client, kind, r, {"post_id": "p3", "actor": "b"})
    (digest,) = Digest.objects.filter(recipient=r)
    support = User.objects.create_user(f"s-{uuid.uuid4().hex[:6]}", password="pw", is_staff=True)
    support.groups.add(Group.objects.get(name="support"))
    web = Client()
    web.force_login(support)

    listing = web.get(reverse("admin:notifications_digest_changelist"), {"q": r.pk})
    html = listing.content.decode()
    assert listing.status_code == 200 and str(digest.pk) in html and "p3" in html and ">open<" in html
    assert "its notifications are made when its window ends" in html
    at[0] = T0 + timedelta(seconds=WINDOW)
    digests.close_due()
    page = web.get(reverse("admin:notifications_event_change", args=[first.event.pk])).content.decode()
    assert reverse("admin:notifications_digest_change", args=[digest.pk]) in page
    assert "[p3] closed, 2 item(s)" in page and '">push</a>: <b>scheduled</b>' in page
    detail = web.get(reverse("admin:notifications_digest_change", args=[digest.pk]))
    assert detail.status_code == 200 and str(first.event.pk) in detail.content.decode()
    assert web.post(reverse("admin:notifications_digest_change", args=[digest.pk]), {}).status_code == 403
    assert web.get(reverse("admin:notifications_digest_add")).status_code == 403


def test_the_admin_type_form_saves_a_digest_and_refuses_a_bad_one_in_the_apis_words(admin_client):
    from django.urls import reverse

    from tests.test_admin_types import form_post

    body = type_body()
    add = reverse("admin:notifications_notificationtype_add")
    bad = admin_client.post(add, {**form_post("likes_adm", body), "digest": '{"window_seconds": 30}'})
    assert bad.status_code == 200
    assert bad.context["adminform"].form.errors["digest"] == [
        "window_seconds: Ensure this value is greater than or equal to 60."]
    assert not NotificationType.objects.filter(pk="likes_adm").exists()

    good = admin_client.post(add, {**form_post("likes_adm", body), "digest": json.dumps(body["digest"])})
    assert good.status_code == 302, good.context["adminform"].form.errors if good.context else good
    assert NotificationType.objects.get(pk="likes_adm").digest == {"window_seconds": 600,
                                                                   "key": "{{ data.post_id }}"}


def test_a_long_digest_renders_a_bounded_list_of_items_with_the_true_count_and_last(client, at):
    from notifications.events.content import TypeContent

    kind = likes_type()
    TypeTemplate.objects.filter(type=kind).update(
        body="{{ first.actor }}..{{ last.actor }}: {{ count }} likes, {{ items|length }} listed")
    r = a_user()
    total = digests.MAX_RENDERED_ITEMS + 20
    for i in range(total):
        accept(client, kind, r, {"post_id": "p1", "actor": f"a{i}"})
    at[0] = T0 + timedelta(seconds=WINDOW)
    assert digests.close_due() == 1
    (n,) = Notification.objects.filter(recipient=r).select_related("recipient")
    TypeContent().render(n)
    assert n.body == f"a0..a{total - 1}: {total} likes, {digests.MAX_RENDERED_ITEMS} listed"
    assert Digest.objects.get(recipient=r).item_count == total


def test_cancelling_an_event_takes_it_out_of_its_open_digest_and_a_closed_digest_is_kept(client, at):
    kind = likes_type()
    r, alone = a_user(), a_user()
    ada = accept(client, kind, r, {"post_id": "p1", "actor": "Ada"})
    accept(client, kind, r, {"post_id": "p1", "actor": "Bo"})
    only = accept(client, kind, alone, {"post_id": "p1", "actor": "Cy"})

    assert services.cancel_event(ada.event) == 1
    assert services.cancel_event(only.event) == 1
    with pytest.raises(services.NotCancellable):
        services.cancel_event(ada.event)  # nothing of it is left to cancel
    (digest,) = Digest.objects.filter(recipient=r)
    assert items_of(digest) == ["Bo"]

    at[0] = T0 + timedelta(seconds=WINDOW)
    assert digests.close_due() == 2
    assert Notification.objects.filter(recipient=r).count() == 1
    assert Notification.objects.filter(recipient=alone).count() == 0  # its only event was cancelled: nothing sent
    late = accept(client, kind, r, {"post_id": "p2", "actor": "Di"})
    at[0] = T0 + timedelta(seconds=2 * WINDOW + 1)
    digests.close_due()
    with pytest.raises(services.NotCancellable, match="the digest it went into closed"):
        services.cancel_event(late.event)  # its digest closed: its notification is shared, not cancelled by one event
    assert items_of(Digest.objects.get(recipient=r, key="p2")) == ["Di"]


def test_a_fallback_digest_settles_its_next_channel_when_the_first_is_sent_and_keeps_what_it_said(
        providers, module_emulator, client, at):  # noqa: F811
    kind = likes_type(channels=("push", "email"), routing="fallback")
    r = a_user()
    for actor in ("Ada", "Bo"):
        accept(client, kind, r, {"post_id": "p9", "actor": actor})
    at[0] = T0 + timedelta(seconds=WINDOW)
    scheduler.release_due()
    push = Notification.objects.get(recipient=r, channel="push")
    email = Notification.objects.get(recipient=r, channel="email")
    assert (email.status, email.reason) == ("scheduled", "fallback_waiting")

    send_notifications([str(push.pk)])

    push.refresh_from_db(), email.refresh_from_db()
    assert (push.status, push.body) == ("sent", "Ada and 1 others liked your post")  # kept, as for events' rows
    assert (email.status, email.reason) == ("suppressed", "fallback_not_needed")  # at once, not by the sweep
    assert module_emulator.count(channel="email") == 0


def test_two_clients_events_never_share_a_digest(client, at):
    """An admin-made type any service may trigger: one client's events must not show in another's
    notification (the digest's notification is one client's, and it renders every item)."""
    kind = likes_type()
    other = APIClient.objects.create_key(name=f"digest-b-{uuid.uuid4().hex[:6]}")[0]
    r = a_user()
    accept(client, kind, r, {"post_id": "p1", "actor": "Ada"})
    accept(other, kind, r, {"post_id": "p1", "actor": "Bo"})
    accept(client, kind, r, {"post_id": "p1", "actor": "Cy"})

    mine, theirs = (Digest.objects.get(recipient=r, client=c) for c in (client, other))
    assert (items_of(mine), items_of(theirs)) == (["Ada", "Cy"], ["Bo"])
    at[0] = T0 + timedelta(seconds=WINDOW)
    assert digests.close_due() == 2
    assert sorted(Notification.objects.filter(recipient=r).values_list("client_id", "digest_id")) == sorted(
        [(client.pk, mine.pk), (other.pk, theirs.pk)])


def test_a_sensitive_types_digest_key_is_stored_and_shown_only_as_a_hash(client, at):
    kind = likes_type(digest_key="{{ data.code }}", sensitive=True)
    r = a_user()
    first = accept(client, kind, r, {"code": "KEYSECRET77"})
    again = accept(client, kind, r, {"code": "KEYSECRET77"})
    (digest,) = Digest.objects.filter(recipient=r)
    assert digest.key.startswith("dk-") and "KEYSECRET77" not in digest.key
    assert first.digests == again.digests == [digest]  # the same code still shares one digest

"""End to end, digests (docs/TYPES.md, "Digests"): the API, real Celery workers and beat, Postgres,
Redis and the provider emulator. Events of a digest type with the shortest window (60 s); the
platform clock is moved past the window's end (every process reads the offset file), so beat
closes the digest and the worker sends it."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.stack import wait_until
from notifications.events.models import Digest, DigestItem
from notifications.models import Notification
from tests.e2e import SENT, make_user, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LIKES = {
    "name": "Likes", "category": "social", "channels": ["push"], "collapse_key": "post-{{ data.post_id }}",
    "digest": {"window_seconds": 60, "key": "{{ data.post_id }}"},
    "templates": [{"channel": "push", "locale": "en", "title": "Your post {{ data.post_id }}",
                   "body": "{{ items[0].actor }} and {{ count - 1 }} others liked your post"}]}


def likes_type(api, uid: str) -> str:
    key = f"likes_{uid[-6:]}"
    r = api.request("PUT", f"/v1/notification-types/{key}", json=LIKES)
    assert r.status_code == 201, r.text
    return key


def like(api, kind: str, uid: str, post: str, actor: str) -> dict:
    r = api.request("POST", "/v1/events", json={"type": kind, "user_id": uid,
                                                "data": {"post_id": post, "actor": actor}}, key=uuid.uuid4().hex)
    assert r.status_code == 202, r.text
    return r.json()


def sent_digests(uid: str, count: int) -> list[Notification]:
    """Wait until ``count`` digest notifications of ``uid`` exist, then until each is sent."""
    rows = wait_until(lambda: (found := list(Notification.objects.filter(digest__recipient_id=uid)
                                             .order_by("created_at"))) and len(found) >= count and found,
                      30, message=f"{count} digest notification(s)")
    return [wait_status(n.pk, SENT, timeout=30) for n in rows]


def test_five_events_at_once_are_one_push_with_the_count_and_the_types_collapse_key(api, emulator, uid):
    kind = likes_type(api, uid)
    user = make_user(api, uid)
    actors = ["Ada", "Bo", "Cy", "Di", "Ed"]
    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda a: like(api, kind, uid, "p1", a), actors))
    assert len({a["digests"][0]["id"] for a in answers}) == 1 and all(a["notifications"] == [] for a in answers)

    emulator.set_clock_offset(61)  # the window has ended: beat closes the digest, a worker sends it
    (n,) = sent_digests(uid, 1)
    (message,) = emulator.messages(notification_id=str(n.pk))
    assert message["to"] == user["tokens"][0]
    assert message["title"] == "Your post p1"
    first = DigestItem.objects.filter(digest_id=n.digest_id).select_related("event").first().event.data["actor"]
    assert message["body"] == f"{first} and 4 others liked your post"
    assert message["details"]["message"]["apns"]["headers"]["apns-collapse-id"] == "post-p1"
    assert message["details"]["message"]["android"]["collapse_key"] == "post-p1"
    assert len(emulator.messages(to=user["tokens"][0])) == 1
    assert Digest.objects.get(recipient_id=uid).item_count == 5

    story = api.request("GET", f"/v1/events/{answers[0]['id']}").json()
    (recipient,) = story["recipients"]
    assert (recipient["digest"]["state"], recipient["digest"]["items"], recipient["outcome"]) == ("closed", 5,
                                                                                                "reached")
    assert [x["id"] for x in recipient["notifications"]] == [str(n.pk)]


def test_keys_a_b_a_b_are_two_messages_of_two(api, emulator, uid):
    kind = likes_type(api, uid)
    user = make_user(api, uid)
    for post, actor in [("A", "a1"), ("B", "b1"), ("A", "a2"), ("B", "b2")]:
        like(api, kind, uid, post, actor)

    emulator.set_clock_offset(61)
    rows = sent_digests(uid, 2)
    got = sorted((m["title"], m["body"], m["details"]["message"]["apns"]["headers"]["apns-collapse-id"])
                 for n in rows for m in emulator.messages(notification_id=str(n.pk)))
    assert got == [("Your post A", "a1 and 1 others liked your post", "post-A"),
                   ("Your post B", "b1 and 1 others liked your post", "post-B")]
    assert len(emulator.messages(to=user["tokens"][0])) == 2


def test_worker_and_beat_killed_while_the_window_is_open_still_send_one_digest_of_every_item(api, emulator, uid,
                                                                                            stack):
    kind = likes_type(api, uid)
    user = make_user(api, uid)
    like(api, kind, uid, "p", "a1")
    like(api, kind, uid, "p", "a2")
    stack.kill("beat")
    stack.kill("worker_standard")
    like(api, kind, uid, "p", "a3")  # accepted while nothing would close or send it
    emulator.set_clock_offset(61)  # the window ends while beat is down: nothing is closed
    like(api, kind, uid, "p2", "b1")  # another key: its own digest, opened now
    assert not Notification.objects.filter(digest__recipient_id=uid).exists()
    stack.start("beat")
    stack.start("worker_standard")
    stack.wait_for_workers(("standard@",))

    (n,) = sent_digests(uid, 1)
    assert n.digest.key == "p"
    assert list(DigestItem.objects.filter(digest_id=n.digest_id).values_list("event__data__actor", flat=True)) == [
        "a1", "a2", "a3"]
    (message,) = emulator.messages(to=user["tokens"][0])
    assert message["body"] == "a1 and 2 others liked your post"
    assert Digest.objects.get(recipient_id=uid, key="p2").closed_at is None  # its window is still open

"""Concurrent writers of one user's inbox never lose a count update nor deadlock: pipeline writes
(``store.write``, two users per batch), marks by ids and by ``all_before``, and the prune, each in
its own thread and database connection, committed for real (transactional test). Afterwards the
counts rows equal the counts computed from the items (docs on the lock order:
:mod:`notifications.inbox.marks`)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from notifications.inbox import marks, prune, store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import Notification
from preferences.models import Recipient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
USERS = ("ann", "ben")
ROUNDS = 15


def truth(user: str) -> tuple[int, int, int]:
    live = InboxItem.objects.filter(recipient_id=user, archived_at__isnull=True)
    return live.count(), live.filter(read_at__isnull=True).count(), live.filter(seen_at__isnull=True).count()


def test_concurrent_writes_marks_and_prunes_keep_the_counts_exact():
    for user in USERS:
        Recipient.objects.create(user_id=user)
    batches = [[uuid.uuid4() for _ in range(6)] for _ in range(ROUNDS)]
    Notification.objects.bulk_create([Notification(id=i, recipient_id=USERS[k % 2], channel="in_app", status="sent")
                                      for batch in batches for k, i in enumerate(batch)])
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def run(work):
        def target():
            try:
                start.wait()
                for r in range(ROUNDS):
                    work(r)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
            finally:
                connection.close()
        return threading.Thread(target=target)

    def write(r):
        # Every third item expired already, so the prune has work too.
        store.write([store.NewItem(i, USERS[k % 2], "", "", "t", "b", None, NOW + timedelta(seconds=r),
                                   NOW - timedelta(days=1) if k % 3 == 0 else None)
                     for k, i in enumerate(batches[r])])

    def mark_ids(r):
        for user in USERS:
            have = list(InboxItem.objects.filter(recipient_id=user).values_list("pk", flat=True)[:3])
            with contextlib.suppress(marks.UnknownItems):  # pruned meanwhile: refused whole, nothing changed
                marks.mark(user, ("read", "unread", "archived")[r % 3], ids=have)

    def mark_before(r):
        for user in USERS:
            marks.mark(user, ("seen", "read")[r % 2], all_before=NOW + timedelta(seconds=r))

    def prune_some(r):
        prune.prune_batch(now=NOW, batch=2)

    threads = [run(w) for w in (write, mark_ids, mark_before, prune_some)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    assert InboxItem.objects.count() > 0
    for user in USERS:
        row = InboxCounts.objects.get(pk=user)
        assert (row.total, row.unread, row.unseen) == truth(user), user


def test_a_write_that_waited_for_a_mark_is_created_after_it_so_all_before_never_reaches_it():
    """The adversary's case: a mark holds the user's counts row while a pipeline write of an item for
    that user waits on it. The write takes its ``created_at`` after the lock, so an ``all_before`` of
    anything the app listed before never marks the late item."""
    import time

    from django.db import connections, transaction

    from core import clock

    Recipient.objects.create(user_id="cara")
    late = uuid.uuid4()
    Notification.objects.create(id=late, recipient_id="cara", channel="in_app", status="sent")
    first = uuid.uuid4()
    Notification.objects.create(id=first, recipient_id="cara", channel="in_app", status="sent")
    store.write([store.NewItem(first, "cara", "", "", "t", "first", None, None, None)])  # the counts row
    locked, done = threading.Event(), threading.Event()

    def hold_the_lock():
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1 FROM notifications_inboxcounts WHERE recipient_id = 'cara' FOR UPDATE")
            locked.set()
            time.sleep(1.0)
        connections["default"].close()

    def write_late():
        locked.wait()
        store.write([store.NewItem(late, "cara", "", "", "t", "late", None, None, None)])
        connections["default"].close()
        done.set()

    started = clock.now()
    threads = [threading.Thread(target=hold_the_lock), threading.Thread(target=write_late)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert done.is_set()
    item = InboxItem.objects.get(pk=late)
    assert item.created_at >= started + timedelta(seconds=0.9)  # taken after the lock was released

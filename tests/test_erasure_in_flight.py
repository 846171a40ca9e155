"""Erasure against work in flight (hfixa): a send claimed before ``DELETE /v1/users/{id}`` and
retried after it never reaches the id's next holder; its dead letter is never listed or replayed;
an inbox write that loaded the row before the erasure writes nothing after it, and erasure never
deadlocks with a concurrent inbox write (two real connections)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.messages import get_messages
from django.db import connection, transaction

from notifications.delivery import load
from notifications.delivery.checks import Facts, verdict
from notifications.delivery.pipeline import send_notifications
from notifications.inbox import store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from notifications.services import replay_dead_letters
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from preferences.services import upsert_recipient
from providers.registry import reset_backends
from tests.providers.conftest import sendgrid_options

NOW = datetime(2030, 3, 1, 12, 0, tzinfo=UTC)  # the platform clock, years from the host's


def in_flight(user_id: str, channel: str = "email", **fields) -> Notification:
    """A row claimed a minute before the erasure (``sending``: the erasure leaves it to finish)."""
    r = Recipient.objects.create(user_id=user_id, email=f"{user_id}@old.example", phone="+15550000001",
                                 attributes={"first_name": "Old"})
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel=channel, title="Hi Old",
                                       body="your account changed", status="sending", attempts=1,
                                       created_at=NOW - timedelta(minutes=1), **fields)


@pytest.mark.django_db
def test_the_verdict_cancels_a_row_of_a_recipient_erased_after_it_was_created_before_any_other_rule():
    r = Recipient(user_id="v", email="v@example.org", erased_at=NOW)
    before = Notification(id=uuid.uuid4(), recipient=r, channel="email", status="sending",
                          created_at=NOW - timedelta(seconds=1), expires_at=NOW - timedelta(seconds=1))
    after = Notification(id=uuid.uuid4(), recipient=r, channel="email", status="sending", created_at=NOW)

    found = verdict(before, Facts(campaign_cancelled=True, stopped_phones=set()), NOW)

    assert (found.status, found.kind, found.reason) == ("cancelled", "cancelled", "recipient_erased")
    assert found.detail == ("the recipient's personal data was erased at 2030-03-01 12:00:00 UTC, "
                            "after this was created")
    assert verdict(after, Facts(stopped_phones=set()), NOW) is None  # the id's new holder gets its own sends


@pytest.mark.django_db
def test_the_erasure_check_costs_no_query_beyond_the_batch_load(django_assert_num_queries, frozen):
    """The send path's load stage brings ``erased_at`` with the recipient: nothing per row or batch."""
    n = in_flight("q1")
    erase_user(n.recipient, requested_by="api client tests")
    with django_assert_num_queries(1):
        (row,) = load.rows([str(n.pk)])
        assert row.recipient.erased_after(row.created_at) is True


@pytest.fixture
def email_provider(settings, module_emulator):
    module_emulator.reset()
    settings.PROVIDERS = {**settings.PROVIDERS, "email": [
        {"NAME": "sendgrid", "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
         "OPTIONS": sendgrid_options(module_emulator)}]}
    reset_backends()
    yield module_emulator
    reset_backends()


@pytest.mark.django_db(transaction=True)
def test_a_send_in_flight_at_erasure_and_retried_after_it_is_cancelled_not_sent_to_the_ids_new_holder(
        email_provider, frozen):
    """The adversary's repro: a row ``sending`` (provider slow, then 503 → retry) when the user is
    erased, then ``PUT /v1/users/er5`` with a new email. The retry went to the new owner. Erased at
    the platform clock (moved years from the host's): its instant is compared with the row's."""
    n = in_flight("er5")
    erase_user(n.recipient, requested_by="api client tests")
    upsert_recipient("er5", email="new@owner.example", attributes={"first_name": "NewOwner"})
    Notification.objects.filter(pk=n.pk).update(status="queued")  # the 503's retry, released again
    frozen[0] = NOW + timedelta(minutes=1)
    fresh = Notification.objects.create(id=uuid.uuid4(), recipient_id="er5", channel="email", title="Welcome",
                                        body="to the new owner", status="queued", created_at=frozen[0])

    send_notifications([str(n.pk), str(fresh.pk)])

    n.refresh_from_db()
    assert (n.status, n.reason) == ("cancelled", "recipient_erased")
    assert DeliveryEvent.objects.filter(notification=n, kind="cancelled", reason="recipient_erased").count() == 1
    assert DeliveryAttempt.objects.filter(notification=n).count() == 0  # its first call's row was never written
    assert Notification.objects.get(pk=fresh.pk).status == "sent"
    assert email_provider.count() == 1  # the new owner's own message only
    (received,) = email_provider.messages()
    assert "to the new owner" in str(received)


@pytest.mark.django_db
def test_a_dead_letter_of_a_recipient_erased_after_it_was_created_is_neither_listed_nor_replayed(admin_client,
                                                                                                 frozen):
    n = in_flight("er6", channel="sms")
    erase_user(n.recipient, requested_by="api client tests")
    # The call in flight failed after the erasure and the attempts were spent: dead-lettered after it.
    Notification.objects.filter(pk=n.pk).update(status="failed", reason="attempts_exhausted",
                                                dead_lettered_at=NOW)
    later = Notification.objects.create(id=uuid.uuid4(), recipient_id="er6", channel="sms", body="new owner's",
                                        status="failed", reason="attempts_exhausted", dead_lettered_at=NOW,
                                        created_at=NOW + timedelta(seconds=1))

    page = admin_client.get("/admin/notifications/deadletter/").content.decode()

    assert "Dead letters: 1" in page and str(later.pk) in page and str(n.pk) not in page
    assert replay_dead_letters([n.pk], by="staff") == 0
    n.refresh_from_db()
    assert (n.status, n.attempts) == ("failed", 1)


@pytest.mark.django_db
def test_the_replay_action_says_how_many_were_refused_and_why(admin_client):
    r = Recipient.objects.create(user_id="rf-1", phone="+15550000002")
    bad = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="x" * 1601,
                                      status="failed", reason="attempts_exhausted", dead_lettered_at=NOW,
                                        created_at=NOW + timedelta(seconds=1))

    page = admin_client.post("/admin/notifications/deadletter/", {"action": "replay", "_selected_action": [
        str(bad.pk)]}, follow=True)

    said = [str(m) for m in get_messages(page.wsgi_request)]
    assert said == ["Refused 1 dead letter(s), still dead-lettered (their timeline says why): the rendered SMS "
                    "body is 1601 characters; at most 1600 (Twilio)"]
    assert Notification.objects.get(pk=bad.pk).status == "failed"


@pytest.mark.django_db
def test_an_inbox_write_that_loaded_its_row_before_the_erasure_writes_nothing_after_it(frozen):
    n = in_flight("ie2", channel="in_app")
    item = store.NewItem(n.pk, "ie2", "", "", n.title, n.body, None, None, None)  # loaded before the erasure
    erase_user(n.recipient, requested_by="api client tests")

    assert store.write([item]) == set()
    assert InboxItem.objects.filter(recipient_id="ie2").count() == 0


@pytest.mark.django_db(transaction=True)
def test_an_in_app_row_whose_recipient_is_erased_between_load_and_write_is_retried_then_cancelled(
        frozen, monkeypatch):
    """Not recorded ``sent`` without an item: the refused write is a transient error, and the
    retry's checks cancel the row."""
    n = in_flight("ie4", channel="in_app")
    Notification.objects.filter(pk=n.pk).update(status="queued")
    write = store.write

    def erased_meanwhile(items):  # the erasure commits after the batch was loaded and checked
        erase_user(Recipient.objects.get(pk="ie4"), requested_by="api client tests")
        return write(items)

    monkeypatch.setattr(store, "write", erased_meanwhile)
    send_notifications([str(n.pk)])
    n.refresh_from_db()
    assert (n.status, InboxItem.objects.filter(recipient_id="ie4").count()) == ("scheduled", 0)
    monkeypatch.setattr(store, "write", write)
    Notification.objects.filter(pk=n.pk).update(status="queued")  # the scheduler releases the retry

    send_notifications([str(n.pk)])

    n.refresh_from_db()
    assert (n.status, n.reason) == ("cancelled", "recipient_erased")
    assert InboxItem.objects.filter(recipient_id="ie4").count() == 0
    assert list(n.attempts_log.values_list("error_code", flat=True)) == ["recipient_erased"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_erasure_and_an_inbox_write_holding_the_users_counts_never_deadlock(frozen):
    """The writer holds the user's counts row; the erasure locks the recipient and waits for the
    counts; the writer's INSERT then checks its foreign key on the recipient. Before: ``deadlock
    detected`` (FOR UPDATE vs FOR KEY SHARE). Now the write finishes, the erasure deletes its item."""
    n = in_flight("ie3", channel="in_app")
    done = Notification.objects.create(id=uuid.uuid4(), recipient_id="ie3", channel="in_app", title="t",
                                       body="b", status="sent", created_at=NOW - timedelta(minutes=2))
    store.write([store.NewItem(done.pk, "ie3", "", "", "t", "b", None, None, None)])  # the counts row exists
    locked, errors = threading.Event(), []

    def writer():
        try:
            with transaction.atomic():
                InboxCounts.objects.select_for_update().get(recipient_id="ie3")
                locked.set()
                _wait_for_a_lock_wait()  # the erasure now holds the recipient and waits for the counts
                store.write([store.NewItem(n.pk, "ie3", "", "", n.title, n.body, None, None, None)])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def eraser():
        try:
            locked.wait(10)
            erase_user(Recipient.objects.get(pk="ie3"), requested_by="api client tests")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer), threading.Thread(target=eraser)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert InboxItem.objects.filter(recipient_id="ie3").count() == 0
    assert Recipient.objects.get(pk="ie3").erasures.count() == 1


def _wait_for_a_lock_wait(timeout: float = 10.0) -> None:
    """Until another backend of this database waits for a lock (the activity view is re-read each
    time: inside a transaction it is otherwise a snapshot)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cur.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the erasure never waited for the counts row")


@pytest.mark.django_db
def test_the_migration_backfills_erased_at_with_each_recipients_latest_erasure():
    import importlib

    from django.apps import apps

    from preferences.models import Erasure

    migration = importlib.import_module("preferences.migrations.0008_recipient_erased_at")
    twice = Recipient.objects.create(user_id="bf-1")
    Recipient.objects.create(user_id="bf-2")  # never erased
    first, last = (Erasure.objects.create(recipient=twice, requested_by="admin a") for _ in range(2))
    Erasure.objects.filter(pk=first.pk).update(erased_at=NOW)
    Erasure.objects.filter(pk=last.pk).update(erased_at=NOW + timedelta(days=1))

    migration.backfill(apps, None)

    assert dict(Recipient.objects.filter(user_id__startswith="bf-").values_list("user_id", "erased_at")) == {
        "bf-1": NOW + timedelta(days=1), "bf-2": None}

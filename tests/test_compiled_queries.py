"""The load stage's SELECTs and the caps stage's admin rules are compiled to SQL once per thread
(core/compiled.py): the second batch compiles nothing, yet reads the data as it is now and gets
the same model instances (recipient and preferences attached, the same columns deferred) as the
queryset itself would give."""

from __future__ import annotations

import threading
import uuid
from unittest import mock

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext

from notifications.delivery import caps, load
from notifications.models import FrequencyCap, Notification
from preferences.models import Preferences, Recipient, SmsStop

pytestmark = pytest.mark.django_db


@pytest.fixture
def compiles():
    """Counts Django's SQL compiles (``SQLCompiler.as_sql``) while the test runs."""
    counter = mock.Mock(wraps=None)
    original = SQLCompiler.as_sql

    def counting(self, *args, **kwargs):
        counter()
        return original(self, *args, **kwargs)

    with mock.patch.object(SQLCompiler, "as_sql", counting):
        yield counter


def _rows(count: int, phone_prefix: str = "+1555777") -> list[Notification]:
    made = []
    for i in range(count):
        r = Recipient.objects.create(user_id=f"cq-{uuid.uuid4().hex[:8]}", phone=f"{phone_prefix}{i:04d}")
        Preferences.objects.create(recipient=r, opt_outs=["email"])
        made.append(Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="hi", priority="high",
                                                status="sending", attempts=1))
    return made


def test_the_rows_are_the_querysets_own_and_a_second_batch_compiles_nothing(compiles):
    first, second = _rows(1), _rows(2)
    load.rows([first[0].pk])  # this thread's compile, whenever the module first ran it

    compiles.reset_mock()
    with CaptureQueriesContext(connection) as queries:
        found = load.rows([n.pk for n in second])
        assert sorted(str(n.recipient.phone) for n in found) == sorted(n.recipient.phone for n in second)
        assert all(n.recipient.preferences.opt_outs == ["email"] for n in found)

    assert compiles.call_count == 0
    assert len(queries) == 1  # recipient and preferences came with the rows
    orm = (Notification.objects.filter(pk__in=[n.pk for n in second])
           .select_related("recipient", "recipient__preferences").defer(*load._NOT_NEEDED_TO_SEND))
    by_pk = {n.pk: n for n in orm}
    for n in found:
        assert n.get_deferred_fields() == by_pk[n.pk].get_deferred_fields()
        assert n.recipient.get_deferred_fields() == by_pk[n.pk].recipient.get_deferred_fields()
        assert (n.body, n.channel, n.priority, n.status, n.attempts, n._state.db, n._state.adding) == (
            "hi", "sms", "high", "sending", 1, "default", False)
    assert load.rows([]) == []


def test_the_stop_list_is_read_afresh_each_batch_from_sql_compiled_once(compiles, settings):
    from notifications.delivery.routing import sms_sender

    batch = _rows(3, "+1555888")
    load.stopped_phones(batch)
    compiles.reset_mock()
    assert load.stopped_phones(batch) == set()

    SmsStop.objects.create(phone=batch[1].recipient.phone, sender=sms_sender(), source="twilio 21610")
    SmsStop.objects.create(phone=batch[2].recipient.phone, sender="+15550000000", source="twilio 21610")

    assert load.stopped_phones(batch) == {batch[1].recipient.phone}  # the other sender's STOP is not ours
    assert compiles.call_count == 0


def test_an_admin_cap_rule_added_after_the_compile_is_read_by_the_next_batch(compiles, settings):
    settings.NOTIFY = {**settings.NOTIFY, "FREQUENCY_CAPS": []}
    assert caps.rules() == []
    compiles.reset_mock()
    FrequencyCap.objects.create(name="cq-news", category="news", channel="sms", limit=2, window_seconds=3600)

    assert [(r.name, r.limit, r.source) for r in caps.rules()] == [("cq-news", 2, "admin")]
    assert compiles.call_count == 0  # the SELECT of the rules was not compiled again


def test_each_thread_compiles_its_own_statement_on_its_own_connection():
    """Django's connections are per thread: a compile made in one thread is never run on another's."""
    first = _rows(1)[0]
    assert [n.pk for n in load.rows([first.pk])] == [first.pk]
    seen = []

    def other():
        from django.db import connections
        try:
            seen.append([n.pk for n in load.rows([uuid.uuid4()])])
            seen.append(load._ROWS._local.state.db)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [[], "default"]


def test_an_acceptance_limit_added_after_the_compile_is_in_force_for_the_next_request(compiles, settings):
    from notifications.acceptance.models import AcceptanceLimit
    from notifications.acceptance.rules import effective_rules

    settings.NOTIFY = {**settings.NOTIFY, "ACCEPTANCE_LIMITS": []}
    assert effective_rules() == []
    compiles.reset_mock()
    AcceptanceLimit.objects.create(name="cq-otp", category="security", per="phone", limit=3, window_seconds=600)

    assert [(r.name, r.limit, r.per, r.source) for r in effective_rules()] == [("cq-otp", 3, "phone", "admin")]
    AcceptanceLimit.objects.filter(name="cq-otp").update(enabled=False)
    assert effective_rules() == []
    assert compiles.call_count == 0  # the SELECT of the rows was not compiled again (the UPDATE has its own)


def test_a_send_request_finds_its_recipient_without_compiling_and_refuses_an_unknown_one(compiles):
    from notifications.api.serializers import SendRequestSerializer

    Recipient.objects.create(user_id="cq-known", phone="+15557779999")
    body = {"user_id": "cq-known", "channel": "sms", "content": {"body": "hi"}}
    assert SendRequestSerializer(data=body).is_valid()
    compiles.reset_mock()

    ser = SendRequestSerializer(data=body)
    assert ser.is_valid(), ser.errors
    assert (ser.validated_data["recipient"].pk, ser.validated_data["recipient"].phone) == ("cq-known", "+15557779999")
    unknown = SendRequestSerializer(data={**body, "user_id": "cq-KNOWN"})
    assert not unknown.is_valid()
    assert [(str(e), e.code) for e in unknown.errors["user_id"]] == [
        ("unknown user; create it with PUT /v1/users/cq-KNOWN", "unknown_user")]
    assert compiles.call_count == 0

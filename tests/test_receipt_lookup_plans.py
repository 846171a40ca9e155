"""Receipts read only their own rows, whatever the batch holds. ``bench --receipts`` found one query
OR-ing our id, the provider's message id and the recipient's address: a SendGrid message id names a
whole request (up to 1,000 recipients) and the address is a column of the joined recipient, so each
batch of events read every row of every request it touched and scanned the recipients (~20 ms per
batch at 20,000 rows, growing with the table). ``EXPLAIN ANALYZE`` counts the rows each query read."""

import json
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications import receipts
from notifications.models import Notification
from preferences.models import Recipient
from providers.receipts import ACCEPTED, DELIVERED, Receipt

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows():
    """300 email rows in three requests of 100 (one SendGrid message id each), 300 SMS rows."""
    recipients = Recipient.objects.bulk_create([
        Recipient(user_id=f"lk-{i:04d}", phone=f"+49151{i:08d}", email=f"Lk{i}@Example.com") for i in range(300)])
    email = Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), recipient=r, channel="email", body="b", status="sent",
                     provider_message_id=f"sg-{i // 100}") for i, r in enumerate(recipients)])
    sms = Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="sent",
                     provider_message_id=f"SM{uuid.uuid4().hex}") for r in recipients])
    with connection.cursor() as cur:
        cur.execute("ANALYZE notifications_notification")
        cur.execute("ANALYZE preferences_recipient")
    return email, sms


def sendgrid(n: Notification, kind: str = DELIVERED, *, with_id: bool = True) -> Receipt:
    return Receipt(provider="sendgrid", dedup_key=f"sg:{n.pk}:{kind}", kind=kind, raw=kind,
                   notification_id=str(n.pk) if with_id else None, provider_message_id=n.provider_message_id,
                   address=n.recipient.email.upper(), contact=n.recipient.email)


def twilio(n: Notification, kind: str = ACCEPTED) -> Receipt:
    return Receipt(provider="twilio", dedup_key=f"tw:{n.pk}:{kind}", kind=kind, raw="sent",
                   provider_message_id=n.provider_message_id)


def _rows_read(node: dict, out: dict) -> dict:
    """Rows each table's scans returned in a JSON plan (summed over loops)."""
    table = node.get("Relation Name")
    if table:
        out[table] = out.get(table, 0) + node["Actual Rows"] * node.get("Actual Loops", 1)
    for child in node.get("Plans", []):
        _rows_read(child, out)
    return out


def lookup(batch: list[Receipt]) -> tuple[dict, list[dict]]:
    """What :func:`receipts._find_all` found, and the rows each query it ran read per table."""
    with CaptureQueriesContext(connection) as queries:
        found = receipts._find_all(batch)
    read = []
    with connection.cursor() as cur:
        for q in queries.captured_queries:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q["sql"])
            plan = cur.fetchone()[0]
            read.append(_rows_read((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"], {}))
    return found, read


TEN_OF_EACH_REQUEST = [*range(0, 10), *range(100, 110), *range(200, 210)]


@pytest.mark.parametrize("case", ["sendgrid with our ids", "sendgrid without our ids", "twilio", "mixed"])
def test_receipts_read_only_their_own_rows(rows, case):
    email, sms = rows
    mine = [email[i] for i in TEN_OF_EACH_REQUEST]
    batch = {
        "sendgrid with our ids": [sendgrid(n) for n in mine],
        "sendgrid without our ids": [sendgrid(n, with_id=False) for n in mine],
        "twilio": [twilio(n) for n in sms[:30]],
        "mixed": [sendgrid(email[5]), sendgrid(email[106], with_id=False), twilio(sms[7]),
                  Receipt(provider="twilio", dedup_key="tw:unknown", kind=ACCEPTED, raw="sent",
                          provider_message_id="SMnot-ours")],
    }[case]
    expected = {"sendgrid with our ids": mine, "sendgrid without our ids": mine, "twilio": sms[:30],
                "mixed": [email[5], email[106], sms[7]]}[case]
    found, read = lookup(batch)
    assert [found[i].pk for i in sorted(found)] == [n.pk for n in expected]
    notifications = sum(r.get("notifications_notification", 0) for r in read)
    if case == "sendgrid without our ids":
        # Only the request id and the address name the row: the requests' rows are read, no more.
        assert len(read) == 1 and notifications == 300, read
    elif case == "mixed":  # ours by id (1); the request of the one without our id (100), the SMS (1)
        assert notifications == 1 + 100 + 1, read
    else:  # (how the recipients are joined is the planner's choice for a table this small)
        assert notifications == len(expected), read


def test_a_request_id_alone_finds_only_the_row_sent_to_that_address(rows):
    email, _ = rows
    found, _read = lookup([sendgrid(email[3], with_id=False)])
    assert {i: n.pk for i, n in found.items()} == {0: email[3].pk}

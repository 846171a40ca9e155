"""What rule segments cost on a million recipients (docs/SEGMENTS.md, "What a rule costs"): the
common selective rules are index scans (an attribute's value, a locale); a rule that must read every
recipient is bounded for a preview by its statement timeout, answered with the planner's estimate;
an engagement rule reads only the history partitions of its window.

One million recipients are COPYed in (bench.seed.copy_rows) and ANALYZEd; the plans are EXPLAINed,
not run, and assert which scans they use, never how long they take."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from bench.seed import copy_rows
from campaigns.membership import matching, preview
from campaigns.rules import Context
from notifications.lifecycle.archive import into_history
from notifications.migrations._history_sql import HISTORY, LIVE
from notifications.models import Notification
from preferences.models import Device, Recipient

pytestmark = pytest.mark.django_db

N = 1_000_000
NOW = datetime.now(UTC)
LOCALES = ["en"] * 90 + ["fr"] * 8 + ["de", "de-AT"]  # de and its subtags: 2 %


@pytest.fixture
def million():
    created = NOW - timedelta(days=30)

    def rows():
        for i in range(N):
            attributes = {"tier": f"t{i % 1000}"} | ({"cohort": "beta"} if i % 10_000 == 0 else {})
            yield {"user_id": f"u{i:07d}", "locale": LOCALES[i % 100], "timezone": "Europe/Berlin",
                   "email": f"u{i}@example.org" if i % 2 else "", "attributes": attributes,
                   "created_at": created, "updated_at": created}

    copy_rows(Recipient, rows(), conflict_free=True)

    def devices():  # every tenth recipient has an active push device
        for i in range(0, N, 10):
            yield {"recipient_id": f"u{i:07d}", "platform": "android", "push_token": f"tok-{i}", "active": True,
                   "deactivated_reason": "", "registered_at": created, "updated_at": created}

    copy_rows(Device, devices(), conflict_free=True)
    with connection.cursor() as cur:
        cur.execute("ANALYZE preferences_recipient")
        cur.execute("ANALYZE preferences_device")


def plan_of(rules, context: Context) -> str:
    sql, params = matching(rules, context).values("user_id").query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


@pytest.mark.timeout(600)  # the COPY of a million rows, on a shared machine
def test_common_rules_on_a_million_recipients_use_their_indexes_and_a_full_scan_preview_is_bounded(
        million, settings):
    context = Context(now=NOW, channel="email", category="marketing")
    plan = plan_of({"attribute": "tier", "op": "eq", "value": "t7"}, context)
    assert "recipient_attributes_gin" in plan, plan
    assert "Seq Scan on preferences_recipient" not in plan, plan
    plan = plan_of({"attribute": "tier", "op": "in", "value": ["t7", "t8", "t9"]}, context)
    assert "recipient_attributes_gin" in plan and "Seq Scan on preferences_recipient" not in plan, plan
    plan = plan_of({"locale": ["de"]}, context)
    assert "recipient_locale_idx" in plan and "Seq Scan on preferences_recipient" not in plan, plan
    plan = plan_of({"and": [{"locale": ["de"]}, {"has": "email"}, {"subscribed": True}]}, context)
    assert "recipient_locale_idx" in plan and "Seq Scan on preferences_recipient" not in plan, plan
    # Reachability after a selective rule (100 recipients): each candidate's devices probed by their
    # index, the 100,000 devices never read whole; on its own, one pass over the devices (a tenth of
    # everyone). Between the two (a tier's 1,000) either plan is fair, and the planner's choice.
    push = Context(now=NOW, channel="push", category="marketing")
    plan = plan_of({"and": [{"attribute": "cohort", "op": "eq", "value": "beta"}, {"has": "push_device"}]}, push)
    assert "recipient_attributes_gin" in plan and "Seq Scan on preferences_recipient" not in plan, plan
    assert "Nested Loop Semi Join" in plan and "Seq Scan on preferences_device" not in plan, plan
    assert [line for line in plan.splitlines() if "Index Scan" in line and "on preferences_device" in line], plan
    plan = plan_of({"has": "push_device"}, push)
    assert "Hash Semi Join" in plan and plan.count("Seq Scan on preferences_device") == 1, plan

    # Exact when it fits the timeout ...
    assert preview({"attribute": "tier", "op": "eq", "value": "t7"}, context).as_dict() == {
        "count": 1000, "exact": True}
    # ... and a rule that reads every row is cut off by it: the planner's estimate, marked so.
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PREVIEW_TIMEOUT_MS": 1}
    broad = {"not": {"locale": ["de"]}}
    assert "Seq Scan on preferences_recipient" in plan_of(broad, context)
    counted = preview(broad, context)
    assert counted.exact is False
    assert abs(counted.count - 980_000) < 50_000  # the estimate of 98 %


DAYS = 10
TODAY = NOW.replace(hour=0, minute=0, second=0, microsecond=0)


def test_an_engagement_rule_reads_only_the_partitions_of_its_window():
    """Ten day partitions of history: "sent within 3 days" reads the live table and the partitions
    from three days back on, through their recipient index; older days are pruned at planning."""
    with connection.cursor() as cur:
        for back in range(1, DAYS + 1):
            day = TODAY - timedelta(days=back)
            cur.execute(f"CREATE TABLE {HISTORY}_p{day:%Y%m%d} PARTITION OF {HISTORY} "
                        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')")
    recipients = Recipient.objects.bulk_create([Recipient(user_id=f"r{i:04d}") for i in range(300)])
    Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="delivered",
                     created_at=TODAY + timedelta(hours=12) - timedelta(days=back), updated_at=TODAY)
        for r in recipients for back in range(DAYS + 1)], batch_size=2000)
    with connection.cursor() as cur:
        cur.execute(f"WITH moved AS (DELETE FROM {LIVE} WHERE created_at < %s RETURNING *) "
                    + into_history("moved", "created_at + interval '6 hours'"), [TODAY])  # archived that day
        cur.execute(f"ANALYZE {LIVE}")
        cur.execute(f"ANALYZE {HISTORY}")
        cur.execute("ANALYZE preferences_recipient")
        cur.execute("SET LOCAL enable_seqscan = off")
    plan = plan_of({"engaged": "sent", "within_days": 3}, Context(now=TODAY + timedelta(hours=12)))
    scans = [line for line in plan.splitlines()
             if " on notifications_notification" in line and "Scan" in line and "Bitmap Index Scan" not in line]
    read = {line.split(" on ")[1].split()[0] for line in scans}
    days = [f"{HISTORY}_p{TODAY - timedelta(days=back):%Y%m%d}" for back in (1, 2, 3)]
    assert read == {LIVE, *days, f"{HISTORY}_default"}, plan
    assert not [line for line in scans if "Seq Scan" in line], plan
    assert len(matching({"engaged": "sent", "within_days": 3}, Context(now=TODAY + timedelta(hours=12)))) == 300

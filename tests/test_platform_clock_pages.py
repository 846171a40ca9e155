"""Admin pages read the platform clock (core.clock, which tests and e2e move with CLOCK_OFFSET_FILE)
wherever they compare "now" with instants it stamped: the notification, event and audit lists' date
filter ("Today", "Past 7 days"…) and the provider health page's recent calls (the queue ages:
tests/test_metrics.py). Django's own code reads the host's clock. In-process, real Postgres."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications.health_admin import recent_calls
from notifications.models import DeliveryAttempt, Notification
from preferences.models import Recipient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

#: The platform clock, years from the host's.
NOW = datetime(2030, 5, 20, 12, 0, tzinfo=UTC)


def a_notification(created_at: datetime) -> Notification:
    r, _ = Recipient.objects.get_or_create(user_id="pc-user")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="sent",
                                       created_at=created_at, updated_at=created_at)


@pytest.mark.parametrize("path, field", [("/admin/notifications/notification/", "created_at"),
                                         ("/admin/notifications/event/", "created_at"),
                                         ("/admin/notifications/apiauditentry/", "at")])
def test_the_date_filters_today_is_the_platform_clocks(frozen, admin_client, path, field):
    page = admin_client.get(path)
    assert page.status_code == 200
    [spec] = [s for s in page.context_data["cl"].filter_specs if getattr(s, "field_path", None) == field]
    today = datetime(2030, 5, 20, tzinfo=UTC)
    assert [params for _label, params in spec.links[:5]] == [
        {}, {f"{field}__gte": today, f"{field}__lt": today + timedelta(days=1)},
        {f"{field}__gte": today - timedelta(days=7), f"{field}__lt": today + timedelta(days=1)},
        {f"{field}__gte": datetime(2030, 5, 1, tzinfo=UTC), f"{field}__lt": datetime(2030, 6, 1, tzinfo=UTC)},
        {f"{field}__gte": datetime(2030, 1, 1, tzinfo=UTC), f"{field}__lt": datetime(2031, 1, 1, tzinfo=UTC)}]


def test_recent_calls_are_the_last_minutes_of_the_platform_clock(frozen):
    n = a_notification(NOW - timedelta(hours=1))
    for minutes_ago in (1, 14, 16, 60):
        DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="accepted",
                                       created_at=NOW - timedelta(minutes=minutes_ago))
    # An attempt the breaker refused is no call: counted apart (hadv34 #3).
    DeliveryAttempt.objects.create(notification=n, number=2, provider="twilio", outcome="transient",
                                   error_code="circuit_open", latency_ms=0, created_at=NOW - timedelta(minutes=2))
    assert recent_calls(15) == ({("twilio", "accepted"): 2, ("twilio", "not_called"): 1}, False)

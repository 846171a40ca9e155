"""Webhook deliveries are kept ``WEBHOOKS_KEEP_DAYS`` (docs/WEBHOOKS.md, "Retention"): beat deletes
older ones with their attempts, a batch per statement, whatever their state; deleting an endpoint
removes its deliveries set-based; the settings check keeps retention longer than the retries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from notifications.apps import check_pipeline_settings
from notifications.webhooks import endpoints, retention
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.conftest import make_client

pytestmark = pytest.mark.django_db

NOW = datetime(2027, 5, 10, 12, 0, tzinfo=UTC)


def deliveries(endpoint, ages_days: list[float], state: str = "delivered") -> list[WebhookDelivery]:
    made = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint=endpoint, event_type="notification.sent", payload={"n": k}, state=state,
                        created_at=NOW - timedelta(days=age), next_attempt_at=NOW - timedelta(days=age))
        for k, age in enumerate(ages_days)])
    WebhookAttempt.objects.bulk_create([WebhookAttempt(delivery=d, number=1, http_status=200) for d in made])
    return made


def test_deliveries_older_than_the_retention_go_with_their_attempts_in_batches(settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "KEEP_DAYS": 7}
    client, _ = make_client()
    a = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])
    b = endpoints.create(client, "https://hooks.example.com/b", ["notification.sent"])
    b.active = False  # a disabled endpoint's pending deliveries are never sent: they go too
    b.save()
    old_a = deliveries(a, [30, 8, 7.01, 7.5, 9])
    kept_a = deliveries(a, [6.99, 1, 0])
    old_b = deliveries(b, [10, 20], state="pending")
    kept_b = deliveries(b, [2], state="failed")

    assert retention.prune(now=NOW, batch=2) == len(old_a) + len(old_b)

    left = set(WebhookDelivery.objects.values_list("pk", flat=True))
    assert left == {d.pk for d in kept_a + kept_b}
    assert set(WebhookAttempt.objects.values_list("delivery_id", flat=True)) == left
    assert retention.prune(now=NOW, batch=2) == 0


def test_a_tick_stops_at_its_budget_and_the_next_goes_on(settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "KEEP_DAYS": 7}
    client, _ = make_client()
    a = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])
    deliveries(a, [8, 9, 10, 11, 12])

    assert retention.prune(now=NOW, batch=2, budget_seconds=0) == 2  # one batch, then the budget is spent
    assert retention.prune(now=NOW, batch=2) == 3
    assert WebhookDelivery.objects.count() == 0


def test_deleting_an_endpoint_removes_its_deliveries_and_attempts_only(settings):
    client, key = make_client()
    a = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])
    b = endpoints.create(client, "https://hooks.example.com/b", ["notification.sent"])
    deliveries(a, [0, 1, 2], state="pending")
    kept = deliveries(b, [0, 1])

    response = Client(headers={"Authorization": f"Api-Key {key}"}).delete(f"/v1/webhook-endpoints/{a.pk}")

    assert response.status_code == 204, response.content
    assert list(WebhookEndpoint.objects.values_list("pk", flat=True)) == [b.pk]
    assert set(WebhookDelivery.objects.values_list("pk", flat=True)) == {d.pk for d in kept}
    assert WebhookAttempt.objects.count() == len(kept)


def test_the_admin_offers_no_delete_of_an_endpoint(client):
    staff = User.objects.create_superuser("root", "root@example.org", "pw-root-123")
    owner, _ = make_client()
    endpoint = endpoints.create(owner, "https://hooks.example.com/a", ["notification.sent"])
    client.force_login(staff)
    assert client.get(f"/admin/notifications/webhookendpoint/{endpoint.pk}/delete/").status_code == 403
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


@pytest.mark.parametrize(("keep", "problem"), [(1, "longer than WEBHOOKS_RETRY_FOR_SECONDS"),
                                               (0, "whole days >= 1"), (2, None)])
def test_the_check_keeps_deliveries_longer_than_their_retries(settings, keep, problem):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "KEEP_DAYS": keep, "RETRY_FOR_SECONDS": 86400.0}
    found = [p for p in check_pipeline_settings() if p.startswith("WEBHOOKS_KEEP_DAYS")]
    assert (problem in found[0]) if problem else found == []

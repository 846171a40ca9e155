"""Support's replay of webhook deliveries (docs/WEBHOOKS.md, "Delivery"): what it made due now, and
what it did not and why: a disabled endpoint's deliveries wait for its re-enabling, ones already due
are unchanged. The admin says each, exactly."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from core import clock
from notifications.webhooks import delivery, endpoints
from notifications.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.conftest import make_client
from tests.test_status_webhooks import deliveries_for, staff_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]


@pytest.fixture
def three():
    """A failed delivery of an active endpoint, two failed of a disabled one, one already due."""
    active = endpoints.create(make_client()[0], "https://hooks.example.com/active", ["notification.sent"])
    off = endpoints.create(make_client()[0], "https://hooks.example.com/off", ["notification.sent"])
    failed = deliveries_for(active, 2)
    of_off = deliveries_for(off, 2)
    WebhookDelivery.objects.filter(pk__in=[failed[0].pk, *(d.pk for d in of_off)]).update(
        state="failed", give_up_at=clock.now())
    WebhookEndpoint.objects.filter(pk=off.pk).update(active=False, disabled_reason="disabled by root")
    return failed[0], of_off, failed[1]  # failed[1] is still pending and due


def test_replay_says_what_it_made_due_and_what_waits_for_a_disabled_endpoint(three):
    failed, of_off, already = three

    done = delivery.replay([failed, *of_off, already])

    assert done == delivery.Replayed(due=1, disabled=2, already_due=1,
                                     disabled_endpoints=["https://hooks.example.com/off"])
    states = {d.pk: (d.state, d.give_up_at) for d in WebhookDelivery.objects.all()}
    assert states == {d.pk: ("pending", None) for d in (failed, *of_off, already)}  # the disabled: sent once re-enabled
    assert delivery.dispatch() == 1  # the active endpoint only


def test_the_admin_message_names_each_outcome(three, client, as_migrated):
    failed, of_off, already = three
    client.force_login(staff_in("support"))

    r = client.post("/admin/notifications/webhookdelivery/",
                    {"action": "replay", "_selected_action": [str(d.pk) for d in (failed, *of_off, already)]})

    assert r.status_code == 302
    assert [(m.level_tag, m.message) for m in get_messages(r.wsgi_request)] == [
        ("success", "1 delivery due again now."),
        ("warning", "2 deliveries not sent now, endpoint disabled: https://hooks.example.com/off. Pending until a "
                    "superuser re-enables it."),
        ("info", "1 delivery was already due: unchanged.")]

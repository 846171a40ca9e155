"""A recurring series tells its client when it is over (docs/RECURRING.md, docs/WEBHOOKS.md "Events"):
its own ``campaign.completed`` (``series: true``) once its rule has no occurrence left and its last run
has finished, after each run's own (``series_id``: the series); once, at whichever of the three
places it completes (beat, the occurrence that ends it skipped, a resume with nothing left)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from campaigns import runs
from campaigns.fanout import reconcile_campaigns
from campaigns.models import Campaign, CampaignStatus
from notifications.models import APIClient
from notifications.webhooks import endpoints
from notifications.webhooks.models import WebhookDelivery
from tests.conftest import MARKETING_SCOPES
from tests.test_campaign_recurring import beat_at, create_series, members, post  # noqa: F401 (members: a fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]

#: Monday 1 March 2027 (the recurring tests' day).
NOW = datetime(2027, 3, 1, 8, 0, tzinfo=UTC)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture
def http_and_endpoint():
    from django.test import Client

    client, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["campaign.completed"])
    return Client(headers={"Authorization": f"Api-Key {key}"}), endpoint


def told() -> list[tuple]:
    """``(campaign_id, series, series_id)`` of every ``campaign.completed``, in the order written."""
    return [(d.payload["data"]["campaign_id"], d.payload["data"]["series"], d.payload["data"]["series_id"])
            for d in WebhookDelivery.objects.filter(event_type="campaign.completed").order_by("created_at")]


def finish_runs(series: Campaign) -> None:
    """The series' scheduled runs sent everything: the campaigns' reconciler completes them."""
    Campaign.objects.filter(series=series, status=CampaignStatus.SCHEDULED).update(status=CampaignStatus.SENDING)
    reconcile_campaigns()


def test_a_bounded_series_tells_each_run_then_itself_once(http_and_endpoint, frozen, members):  # noqa: F811
    http, endpoint = http_and_endpoint
    series = create_series(http, members, rrule="FREQ=DAILY;COUNT=2")
    beat_at(frozen, utc(2027, 3, 1, 8))
    frozen[0] = utc(2027, 3, 1, 10)
    finish_runs(series)
    beat_at(frozen, utc(2027, 3, 2, 8))  # the last run is made: the series goes on while it runs
    assert Campaign.objects.get(pk=series.pk).status == CampaignStatus.SCHEDULED
    frozen[0] = utc(2027, 3, 2, 10)
    finish_runs(series)
    beat_at(frozen, utc(2027, 3, 2, 10, 1))
    beat_at(frozen, utc(2027, 3, 2, 10, 2))

    first, last = series.runs.order_by("occurrence_at").values_list("pk", flat=True)
    assert told() == [(str(first), False, str(series.pk)), (str(last), False, str(series.pk)),
                      (str(series.pk), True, None)]
    done = WebhookDelivery.objects.get(payload__data__campaign_id=str(series.pk))
    assert (done.endpoint_id, done.payload["data"]["at"]) == (endpoint.pk, "2027-03-02T10:01:00Z")


def test_a_series_ended_by_a_skipped_occurrence_tells_itself_at_once(http_and_endpoint, frozen, members):  # noqa: F811
    """COUNT=1 reached after the missed grace: the run is skipped, the series completes in that beat."""
    http, _endpoint = http_and_endpoint
    series = create_series(http, members, rrule="FREQ=DAILY;COUNT=1")
    beat_at(frozen, utc(2027, 3, 1, 19))
    assert Campaign.objects.get(pk=series.pk).status == CampaignStatus.COMPLETED
    assert told() == [(str(series.pk), True, None)]


def test_a_resume_with_nothing_left_tells_the_series_completed(http_and_endpoint, frozen, members):  # noqa: F811
    http, _endpoint = http_and_endpoint
    series = create_series(http, members, rrule="FREQ=DAILY;COUNT=1")
    assert post(http, f"/v1/campaigns/{series.pk}/pause").status_code == 200
    frozen[0] = utc(2027, 3, 2, 8)
    assert runs.resume(series.pk).status == CampaignStatus.COMPLETED
    assert told() == [(str(series.pk), True, None)]


def test_a_one_off_campaign_says_it_is_no_series(http_and_endpoint, members):  # noqa: F811
    _http, endpoint = http_and_endpoint
    one = Campaign.objects.create(client=endpoint.client, segment=members, channel="email", body="x",
                                  status=CampaignStatus.SENDING)
    reconcile_campaigns()
    assert told() == [(str(one.pk), False, None)]

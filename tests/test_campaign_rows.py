"""Campaign rows through the pipeline's services: fan-out's page insert (COPY, and the re-run that
finds rows already there), the ids it computes, and a campaign cancel's timeline against a single
cancel's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from campaigns import fanout, services
from campaigns.models import Campaign, CampaignShard, CampaignStatus
from core import clock
from notifications import ids
from notifications.api.serializers import EventSerializer
from notifications.campaign_rows import CampaignRow, campaign_has_open_notifications, insert_campaign_page
from notifications.models import DeliveryEvent, Notification, Reason, Status
from notifications.services import cancel_notification
from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 10, 11, 30, tzinfo=UTC)  # the platform clock of the tests that freeze it


@hypothesis_settings(max_examples=200, deadline=None)
@given(campaign_id=st.uuids(), user_id=st.text(min_size=1, max_size=64),
       channel=st.sampled_from(["sms", "email", "push"]))
def test_fast_ids_are_the_uuid5_ids(campaign_id, user_id, channel):
    expected = ids.campaign_notification_id(campaign_id, user_id, channel)
    assert ids.campaign_notification_ids(campaign_id, channel)(user_id) == str(expected)


def _rows(user_ids, status=Status.SCHEDULED):
    due = clock.now() + timedelta(hours=1)
    return [CampaignRow(str(uuid.uuid4()), u, status, "", due, None) for u in user_ids]


def test_a_page_already_inserted_creates_only_the_new_rows_and_returns_only_those():
    for u in ("a", "b", "c"):
        make_recipient(u)
    campaign_id, now = uuid.uuid4(), clock.now()
    first = _rows(["a", "b"])
    kwargs = {"campaign_id": campaign_id, "channel": "sms", "priority": "standard", "category": "", "now": now}
    assert insert_campaign_page(rows=first, **kwargs) == [(first[0].id, "scheduled"), (first[1].id, "scheduled")]
    Notification.objects.filter(pk=first[0].id).update(status=Status.CANCELLED)
    third = _rows(["c"], status=Status.QUEUED)
    again = insert_campaign_page(rows=[*first, *third], **kwargs)  # the COPY fails; the rest goes in
    assert again == [(third[0].id, "queued")]
    got = {str(n.pk): (n.recipient_id, n.status, n.accepted_status, n.due_at, n.queued_at)
           for n in Notification.objects.filter(campaign_id=campaign_id)}
    assert got == {first[0].id: ("a", "cancelled", "scheduled", first[0].due, None),
                   first[1].id: ("b", "scheduled", "scheduled", first[1].due, None),
                   third[0].id: ("c", "queued", "queued", None, now)}
    assert campaign_has_open_notifications(campaign_id)
    Notification.objects.filter(campaign_id=campaign_id).update(status=Status.SENT)
    assert not campaign_has_open_notifications(campaign_id)


def test_re_running_a_fanned_out_shard_creates_nothing_twice():
    for u in ("u1", "u2", "u3"):
        make_recipient(u)
    c = make_campaign(["u1", "u2", "u3"], channel="sms")
    created = run_fan_out(c)
    # As if the shard's cursor were lost while the campaign still fans out.
    CampaignShard.objects.filter(campaign=c).update(cursor=None, done=False)
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.FANNING_OUT)
    assert fanout.fan_out_page(str(c.pk), 0) == "done"
    again = list(Notification.objects.filter(campaign_id=c.pk).order_by("recipient_id"))
    assert [(n.pk, n.status) for n in again] == [(n.pk, n.status) for n in created]
    assert CampaignShard.objects.get(campaign=c).created == 3  # the second page created none


def _timeline(notification) -> list[dict]:
    events = DeliveryEvent.objects.filter(notification=notification)
    return [{k: v for k, v in e.items() if k != "at"} for e in EventSerializer(events, many=True).data]


def test_a_campaign_cancel_records_the_same_timeline_as_a_single_cancel(frozen):
    for u in ("u1", "u2"):
        make_recipient(u)
    c = make_campaign(["u1", "u2"], channel="sms")
    one, other = run_fan_out(c)
    cancel_notification(one.pk)
    _, cancelled = services.cancel_campaign(c.pk)
    assert cancelled == 1
    one.refresh_from_db()
    other.refresh_from_db()
    assert (one.status, one.reason, other.status, other.reason) == (
        Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, Status.CANCELLED, Reason.CAMPAIGN_CANCELLED)
    # The same events, each saying its row's own reason: one "cancelled" event, nothing else.
    assert _timeline(one) == [{"kind": "cancelled", "status": "cancelled", "reason": one.reason,
                               "detail": one.reason_detail}]
    assert _timeline(other) == [{"kind": "cancelled", "status": "cancelled", "reason": other.reason,
                                 "detail": other.reason_detail}]
    assert [e["kind"] for e in _timeline(one)] == [e["kind"] for e in _timeline(other)]
    assert other.reason_detail == "its campaign was cancelled"
    assert list(DeliveryEvent.objects.filter(notification__in=[one, other]).values_list("created_at", flat=True)) \
        == [clock.now(), clock.now()]


def test_a_campaigns_metadata_is_on_every_row_by_the_copy_and_by_the_insert_of_a_page_run_again():
    for u in ("m1", "m2"):
        make_recipient(u)
    campaign_id, meta = uuid.uuid4(), {"promo": "WINTER", "wave": 3, "vip": None}
    kwargs = {"campaign_id": campaign_id, "channel": "sms", "priority": "standard", "category": "",
              "now": clock.now(), "metadata": meta}
    first = _rows(["m1"])
    insert_campaign_page(rows=first, **kwargs)  # the COPY
    second = _rows(["m2"])
    assert insert_campaign_page(rows=[*first, *second], **kwargs) == [(second[0].id, "scheduled")]  # the INSERT
    got = {n.recipient_id: n.metadata for n in Notification.objects.filter(campaign_id=campaign_id)}
    assert got == {"m1": meta, "m2": meta}
    plain = _rows(["m1"])
    insert_campaign_page(rows=plain, **{**kwargs, "campaign_id": uuid.uuid4(), "metadata": None})
    assert Notification.objects.get(pk=plain[0].id).metadata is None

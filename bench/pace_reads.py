"""What reading a large campaign's counts costs (``manage.py bench_pace --reads``; docs/PERFORMANCE.md,
"The pace sampler"): the admin campaign list (reloaded every 5 s while a campaign is active) and
``GET /v1/campaigns/{id}``, whole requests through Django's test client, and the counting each does,
before (a full count of the campaign's rows: the list's grouped count, the detail's) and after
(:func:`campaigns.selectors.counts_for`: its tally plus ``per_tick`` moves' changes not folded yet).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.contrib.auth import get_user_model
from django.db.models import Count
from django.test import Client
from django.urls import reverse

from bench.pace_cost import _measure, _median, _move
from campaigns import pace
from campaigns.models import Campaign
from campaigns.selectors import counted_rows, counts_for, counts_of
from core.api.scopes import Scope
from notifications.models import APIClient, NotificationRecord


def _old_list(campaign: Campaign) -> None:
    """The list's grouped count as it was (``selectors.outcomes_for``)."""
    list(NotificationRecord.objects.filter(campaign_id__in=[campaign.pk]).values("campaign_id", "status")
         .annotate(n=Count("id")).order_by())


def _old_detail(campaign: Campaign) -> None:
    counts_of(counted_rows(campaign.pk), campaign)


def _clients() -> tuple[Client, Client]:
    user, _ = get_user_model().objects.get_or_create(username="bench-pace-reads",
                                                     defaults={"is_staff": True, "is_superuser": True})
    admin = Client()
    admin.force_login(user)
    _, key = APIClient.objects.create_key(name=f"bench-pace-reads-{uuid.uuid4().hex[:6]}", scopes=[Scope.READ])
    return admin, Client(headers={"Authorization": f"Api-Key {key}"})


def read_cost(campaign: Campaign, *, reads: int, per_tick: int, log: Callable[[str], None]) -> dict:
    """Wall ms (medians of ``reads``): each reader's counting before and after, and the two requests
    (the list with the campaign on its page, the API detail) as the code now is; the requests before
    are this module's :func:`requests` run on the earlier commit."""
    pace.sample_due()  # the campaign has a tally
    _move(campaign, per_tick)  # changes not folded yet, as between two ticks
    admin, api = _clients()
    list_url, detail_url = reverse("admin:campaigns_campaign_changelist"), f"/v1/campaigns/{campaign.pk}"
    assert admin.get(list_url).status_code == api.get(detail_url).status_code == 200
    steps = {"list_count_before": lambda: _old_list(campaign), "detail_count_before": lambda: _old_detail(campaign),
             "count_after": lambda: counts_for([campaign]),
             "list_request": lambda: admin.get(list_url), "detail_request": lambda: api.get(detail_url)}
    out = {name: _median(_measure(step)[0] for _ in range(reads)) for name, step in steps.items()}
    assert counts_for([campaign])[campaign.pk] == counts_of(counted_rows(campaign.pk), campaign)
    log(f"reads (wall ms): {out}")
    return out

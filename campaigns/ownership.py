"""Who may change, read and use segments, templates and campaigns (docs/ARCHITECTURE.md §10).

The API client that creates one owns it (``client``); admin-made ones have no owner. Change: the
owner only (staff in the admin). Read: templates every client; segments and campaigns the owner and
admin-made ones; notifications a client's own sends and its readable campaigns' (with
:func:`readable_campaign_sends`). Use in a campaign: own and admin-made. What an active
high-priority campaign uses changes only with ``notifications:send_high`` too (the admin:
:func:`locked_for_staff`). Segment and template ids are one namespace (403 ``not_owner``);
campaign ids are ``uuid5(client, key)``. The rules and why: docs/API.md, "Ownership".
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from campaigns.models import Campaign, CampaignStatus, Segment, Template
from core.api.scopes import Scope
from notifications.admission import high_gate_problem
from notifications.models import APIClient, Priority

#: Campaigns whose sends a template edit would still change (rendered at send time).
ACTIVE_STATUSES = (CampaignStatus.DRAFT, CampaignStatus.SCHEDULED, CampaignStatus.FANNING_OUT,
                   CampaignStatus.SENDING, CampaignStatus.PAUSED)


class NotOwner(Exception):
    """``client`` may not ``action`` (``"change"``, ``"read"``, ``"use"``) this segment or template."""

    def __init__(self, obj: Segment | Template, action: str) -> None:
        self.kind = "segment" if isinstance(obj, Segment) else "template"
        self.admin_made = obj.client_id is None
        whose = ("was made in the admin; only staff may change it, in the admin" if self.admin_made
                 else f"belongs to another API client; only its owner may {action} it")
        super().__init__(f"this {self.kind} {whose}")


class NeedsHighScope(Exception):
    """A template or segment that an active high-priority campaign uses, changed (or such a campaign
    cancelled) by a key without ``notifications:send_high``. ``kind`` is ``"template"``,
    ``"segment"`` or ``"campaign"``; ``why`` says which campaign, for the API's message."""

    def __init__(self, campaign: Campaign, kind: str = "template", doing: str = "cancelling") -> None:
        self.campaign, self.kind = campaign, kind
        if kind == "campaign":
            self.why = f"{doing} a high-priority campaign"
            action = f"{doing} it"
        else:
            self.why = f"this {kind} is used by the high-priority campaign {campaign.pk}"
            action = "changing its members" if kind == "segment" else "changing it"
        super().__init__(f"{self.why} ({campaign.status}); {action} needs the scope {Scope.SEND_HIGH}")


def is_owner(obj: Segment | Template | Campaign, client: APIClient) -> bool:
    return obj.client_id is not None and obj.client_id == client.pk


def check_change(obj: Segment | Template, client: APIClient) -> None:
    """Raises NotOwner unless ``client`` owns ``obj``."""
    if not is_owner(obj, client):
        raise NotOwner(obj, "change")


def check_use(obj: Segment | Template, client: APIClient, action: str = "use") -> None:
    """Reading a segment, or using a segment or template in a campaign: its owner, or anyone for an
    admin-made one. Raises NotOwner."""
    if obj.client_id is not None and obj.client_id != client.pk:
        raise NotOwner(obj, action)


def readable_segments(client: APIClient) -> QuerySet[Segment]:
    """The segments ``client`` may read: its own and those made in the admin."""
    return Segment.objects.filter(Q(client=client) | Q(client__isnull=True))


def readable_campaigns(client: APIClient) -> QuerySet[Campaign]:
    """The campaigns ``client`` may read: its own and those made in the admin (no client)."""
    return Campaign.objects.filter(Q(client=client) | Q(client__isnull=True))


def readable_campaign_sends(client: APIClient) -> Q:
    """The sends of the campaigns of :func:`readable_campaigns`, as a filter on notifications: what
    ``client`` may read beyond its own single sends (registered with
    ``notifications.readers.register_read_rule`` by ``CampaignsConfig.ready``)."""
    return Q(campaign_id__in=readable_campaigns(client).values("id"))


def active_high_campaign(obj: Template | Segment) -> Campaign | None:
    """The first active high-priority campaign (oldest) using the template or segment ``obj``, or None."""
    uses = {"template": obj} if isinstance(obj, Template) else {"segment": obj}
    return (Campaign.objects.filter(**uses, priority=Priority.HIGH, status__in=ACTIVE_STATUSES)
            .order_by("created_at").first())


def check_template_change(template: Template, client: APIClient) -> None:
    """Raises NotOwner unless ``client`` owns ``template``, then NeedsHighScope if an active
    high-priority campaign uses it and ``client`` lacks ``notifications:send_high``."""
    check_change(template, client)
    if not client.has_scope(Scope.SEND_HIGH):
        campaign = active_high_campaign(template)
        if campaign is not None:
            raise NeedsHighScope(campaign)


def check_members_change(segment: Segment, client: APIClient) -> None:
    """Adding or removing members: raises NotOwner unless ``client`` owns ``segment``, then
    NeedsHighScope (kind ``"segment"``) if an active high-priority campaign uses it and ``client``
    lacks ``notifications:send_high``."""
    check_change(segment, client)
    if not client.has_scope(Scope.SEND_HIGH):
        campaign = active_high_campaign(segment)
        if campaign is not None:
            raise NeedsHighScope(campaign, "segment")


def check_cancel(campaign: Campaign, client: APIClient, doing: str = "cancelling") -> None:
    """Cancelling, pausing or resuming (``doing``) through the API (its own campaigns only; the caller
    looks it up so): raises NeedsHighScope (kind ``"campaign"``) when the admission gate's high rule
    (:func:`notifications.admission.high_gate_problem`: priority ``high`` or a high-priority type, even
    one made high since) refuses ``client``."""
    if high_gate_problem(client, campaign.priority, campaign.notification_type):
        raise NeedsHighScope(campaign, "campaign", doing)


def locked_for_staff(obj: Template | Segment, may_send_high: bool) -> Campaign | None:
    """The admin's rule: the active high-priority campaign that keeps staff without the permission
    ``campaigns.send_high_priority`` (``may_send_high`` False) from changing ``obj`` (a template's
    variants, a segment's members), or None when they may."""
    return None if may_send_high else active_high_campaign(obj)

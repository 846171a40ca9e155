"""Who may change, read and use segments, templates and campaigns (DESIGN.md §10, issue 11 #2).

The API client that creates a segment, template or campaign owns it (``client``); one made in the
admin has no owner.

* **Change** through the API: the owner only. Admin-made objects: nobody through the API; staff
  change them (and any other) in the admin, where they may also set the owner.
* **Read**: templates, every client with ``read`` (content, no audience); segments, the owner and
  admin-made ones only, as for campaigns: a segment's members are its owner's targeting data (who is
  "at risk of churn"), not something every service needs.
* **Read notifications** (``GET /v1/notifications/{id}`` and ``GET /v1/users/{id}/notifications``
  alike, :func:`readable_notifications`): a client's own single sends and the sends of the
  campaigns it may read. Another client's messages to a shared user are that client's business
  (their content, status and provider's reasons); support reads every one in the admin.
* **Use** in a campaign: the client's own and admin-made segments and templates, so one client's
  edit never changes another client's campaign.
* **High tier**: a template that an active high-priority campaign uses (draft, scheduled, fanning
  out, sending) is changed only by a key holding ``notifications:send_high`` as well: otherwise a
  key that may not send ``high`` could choose the text the high tier delivers.

Segment and template ids are one namespace for every client (a ``PUT`` of a taken id cannot make a
second one), so refusing names the rule (403 ``not_owner``) instead of pretending the id is free.
Campaign ids are ``uuid5(client, key)``: another client's campaign stays a 404, as before.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from campaigns.models import Campaign, CampaignStatus, Segment, Template
from notifications.models import APIClient, Notification, Priority
from notifications.scopes import Scope

#: Campaigns whose sends a template edit would still change (rendered at send time).
ACTIVE_STATUSES = (CampaignStatus.DRAFT, CampaignStatus.SCHEDULED, CampaignStatus.FANNING_OUT,
                   CampaignStatus.SENDING)


class NotOwner(Exception):
    """``client`` may not ``action`` (``"change"``, ``"read"``, ``"use"``) this segment or template."""

    def __init__(self, obj: Segment | Template, action: str) -> None:
        self.kind = "segment" if isinstance(obj, Segment) else "template"
        self.admin_made = obj.client_id is None
        whose = ("was made in the admin; only staff may change it, in the admin" if self.admin_made
                 else f"belongs to another API client; only its owner may {action} it")
        super().__init__(f"this {self.kind} {whose}")


class NeedsHighScope(Exception):
    """A template that an active high-priority campaign uses, changed by a key without
    ``notifications:send_high``."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        super().__init__(f"this template is used by the high-priority campaign {campaign.pk} ({campaign.status}); "
                         f"changing it needs the scope {Scope.SEND_HIGH}")


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


def readable_notifications(client: APIClient) -> QuerySet[Notification]:
    """The notifications ``client`` may read: its own single sends and the sends of the campaigns
    of :func:`readable_campaigns`. The one rule of every API read of notifications (a row a list
    shows can be opened, and no other), never widened by a scope."""
    campaigns = readable_campaigns(client).values("id")
    return Notification.objects.filter(Q(client=client) | Q(campaign_id__in=campaigns))


def active_high_campaign(template: Template) -> Campaign | None:
    """The first active high-priority campaign using ``template`` (oldest), or None."""
    return (Campaign.objects.filter(template=template, priority=Priority.HIGH, status__in=ACTIVE_STATUSES)
            .order_by("created_at").first())


def check_template_change(template: Template, client: APIClient) -> None:
    """Raises NotOwner unless ``client`` owns ``template``, then NeedsHighScope if an active
    high-priority campaign uses it and ``client`` lacks ``notifications:send_high``."""
    check_change(template, client)
    if not client.has_scope(Scope.SEND_HIGH):
        campaign = active_high_campaign(template)
        if campaign is not None:
            raise NeedsHighScope(campaign)

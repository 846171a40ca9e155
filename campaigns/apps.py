from django.apps import AppConfig
from django.core import checks


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = "Campaigns"

    def ready(self) -> None:
        from campaigns.selectors import SendTimeContent, stalled_campaigns
        from notifications.delivery.content import register_content_source
        from notifications.health import register_progress_check

        register_progress_check("campaigns", stalled_campaigns)
        register_content_source(SendTimeContent)
        # A recipient's erasure (DELETE /v1/users/{id}) removes it from every segment.
        from preferences.api.erasure import register_eraser

        register_eraser(erase_memberships, covers={"campaigns.SegmentMember": "deleted",
                                                    "campaigns.CampaignMember": "deleted (a rule segment's "
                                                                                "snapshot still fanning out)",
                                                    "campaigns.SendTimeMember": "the hour chosen from the user's "
                                                                                "engagement cleared; the group "
                                                                                "stays, so a campaign's comparison "
                                                                                "does not change"})
        # Clients read the sends of the campaigns they may read, besides their own.
        from campaigns.ownership import readable_campaign_sends
        from notifications.readers import register_read_rule

        register_read_rule(readable_campaign_sends)
        # A campaign still fanning out inserts its pages by id: its rows stay live until it is done.
        from notifications.lifecycle.archive import register_hold

        register_hold("campaign_fanning_out", FANNING_OUT_HOLD)
        # A campaign's rows carry no client: their webhooks go to the client that launched it.
        from notifications.webhooks.outbox import register_campaign_owner

        register_campaign_owner(CAMPAIGN_OWNER, CAMPAIGNS_OF_CLIENTS)
        checks.register(check_default_timezone, checks.Tags.compatibility)


#: The client that launched a notification ``n``'s campaign (NULL: made in the admin), and the campaigns
#: the clients ``%(clients)s`` launched: whose webhooks a campaign's rows are (notifications/webhooks/outbox.py).
CAMPAIGN_OWNER = "(SELECT c.client_id FROM campaigns_campaign AS c WHERE c.id = n.campaign_id)"
CAMPAIGNS_OF_CLIENTS = "SELECT c.id FROM campaigns_campaign AS c WHERE c.client_id = ANY(%(clients)s::text[])"

#: The archiver keeps a campaign's row ``n`` live while this holds (notifications/lifecycle/archive.py).
FANNING_OUT_HOLD = ("n.campaign_id IS NOT NULL AND EXISTS (SELECT 1 FROM campaigns_campaign AS c "
                    "WHERE c.id = n.campaign_id AND c.status = 'fanning_out')")


def check_default_timezone(app_configs=None, **kwargs):
    """System check: ``CAMPAIGN_DEFAULT_TIMEZONE`` (the fallback zone of local-time fan-out) passes
    the one zone rule; a bad value would fail every fan-out page that needs it."""
    from django.conf import settings
    from django.core.exceptions import ValidationError

    from preferences.validation import validate_iana_zone

    try:
        validate_iana_zone(settings.CAMPAIGNS["DEFAULT_TIMEZONE"])
    except ValidationError as exc:
        return [checks.Error(f"CAMPAIGN_DEFAULT_TIMEZONE: {exc.messages[0]}",
                             hint="See docs/OPERATIONS.md, section Configuration.", id="campaigns.E001")]
    return []


def erase_memberships(recipient_id: str, contacts: list[str], requested_by: str) -> dict[str, int]:
    """This app's part of a recipient's erasure (registered with ``preferences.api.erasure``): it
    leaves every segment (``campaigns.services.remove_from_every_segment``); its send-time members
    (``campaigns.models.SendTimeMember``) lose the hour chosen from its engagement, and keep their
    group, as its notifications keep their status: a finished campaign's comparison stays as it was."""
    from campaigns.models import SendTimeMember
    from campaigns.services import remove_from_every_segment

    SendTimeMember.objects.filter(recipient_id=recipient_id, hour__isnull=False).update(hour=None)
    return {"segment_memberships_removed": remove_from_every_segment(recipient_id)}

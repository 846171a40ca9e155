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
        checks.register(check_default_timezone, checks.Tags.compatibility)


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
                             hint="See the Configuration section of README.md.", id="campaigns.E001")]
    return []

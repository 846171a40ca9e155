from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "campaigns"
    verbose_name = "Campaigns"

    def ready(self) -> None:
        from campaigns.selectors import stalled_campaigns
        from notifications.health import register_progress_check

        register_progress_check("campaigns", stalled_campaigns)

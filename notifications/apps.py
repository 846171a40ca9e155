from django.apps import AppConfig
from django.core import checks


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        checks.register(check_quiet_hours_bypass, checks.Tags.compatibility)
        checks.register(check_metrics_token, checks.Tags.security, deploy=True)


def check_quiet_hours_bypass(app_configs=None, **kwargs):
    """System check: ``QUIET_HOURS_BYPASS_CATEGORIES`` never lets marketing skip quiet hours."""
    from notifications.quiet_hours_policy import check_bypass_setting

    return [checks.Error(problem, hint="See the Configuration section of README.md.", id="notifications.E001")
            for problem in check_bypass_setting()]


def check_metrics_token(app_configs=None, **kwargs):
    """Deploy check (``manage.py check --deploy``): outside local development ``/metrics`` needs
    ``METRICS_TOKEN``; without it every scrape is refused (notifications/metrics.py)."""
    from django.conf import settings

    if getattr(settings, "LOCAL_DEVELOPMENT", False) or getattr(settings, "METRICS_TOKEN", ""):
        return []
    return [checks.Warning("METRICS_TOKEN is not set: outside local development /metrics refuses every request",
                           hint="Set METRICS_TOKEN to a long random value and give it to Prometheus "
                                "(docs/OPERATIONS.md).", id="notifications.W001")]

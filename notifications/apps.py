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


#: The shortest METRICS_TOKEN the deploy check accepts: 32 characters (e.g. ``secrets.token_urlsafe(32)``
#: gives 43), so it cannot be guessed in any number of scrapes.
MIN_METRICS_TOKEN_LENGTH = 32


def check_metrics_token(app_configs=None, **kwargs):
    """Deploy check (``manage.py check --deploy``): outside local development ``/metrics`` needs
    ``METRICS_TOKEN`` (``notifications.W001``; without it every scrape is refused,
    notifications/metrics.py), at least MIN_METRICS_TOKEN_LENGTH characters long
    (``notifications.W002``)."""
    from django.conf import settings

    token = getattr(settings, "METRICS_TOKEN", "")
    if getattr(settings, "LOCAL_DEVELOPMENT", False):
        return []
    if token and len(token) < MIN_METRICS_TOKEN_LENGTH:
        return [checks.Warning(f"METRICS_TOKEN is {len(token)} character{'s' if len(token) != 1 else ''} long; "
                               f"use at least {MIN_METRICS_TOKEN_LENGTH}: a short bearer token can be guessed",
                               hint="Set METRICS_TOKEN to a long random value, e.g. "
                                    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'` "
                                    "(docs/OPERATIONS.md).", id="notifications.W002")]
    if token:
        return []
    return [checks.Warning("METRICS_TOKEN is not set: outside local development /metrics refuses every request",
                           hint="Set METRICS_TOKEN to a long random value and give it to Prometheus "
                                "(docs/OPERATIONS.md).", id="notifications.W001")]

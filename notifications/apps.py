from django.apps import AppConfig
from django.core import checks


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        checks.register(check_quiet_hours_bypass, checks.Tags.compatibility)


def check_quiet_hours_bypass(app_configs=None, **kwargs):
    """System check: ``QUIET_HOURS_BYPASS_CATEGORIES`` never lets marketing skip quiet hours."""
    from notifications.quiet_hours_policy import check_bypass_setting

    return [checks.Error(problem, hint="See the Configuration section of README.md.", id="notifications.E001")
            for problem in check_bypass_setting()]

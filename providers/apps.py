from django.apps import AppConfig
from django.core import checks


class ProvidersConfig(AppConfig):
    name = "providers"
    verbose_name = "Providers"

    def ready(self) -> None:
        checks.register(check_providers, checks.Tags.compatibility)
        checks.register(check_isolation, checks.Tags.compatibility)


def check_providers(app_configs=None, **kwargs):
    """System check: ``settings.PROVIDERS`` is complete (run by `manage.py check`, runserver, tests)."""
    from providers.registry import check_providers_configured

    return [checks.Error(problem, hint="See the Configuration section of README.md.", id="providers.E001")
            for problem in check_providers_configured()]


def check_isolation(app_configs=None, **kwargs):
    """System check: budgets, breakers, bulkheads, batch sizes and leases are in range (a rate of 0
    or a bulkhead of 0 would stall delivery silently)."""
    from providers.isolation import check_isolation_settings

    return [checks.Error(problem, hint="See the Configuration section of README.md.", id="providers.E002")
            for problem in check_isolation_settings()]

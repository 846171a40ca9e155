from django.apps import AppConfig
from django.core import checks


class ProvidersConfig(AppConfig):
    name = "providers"
    verbose_name = "Providers"

    def ready(self) -> None:
        checks.register(check_providers, checks.Tags.compatibility)


def check_providers(app_configs=None, **kwargs):
    """System check: ``settings.PROVIDERS`` is complete (run by `manage.py check`, runserver, tests)."""
    from providers.registry import check_providers_configured

    return [checks.Error(problem, hint="See the Configuration section of README.md.", id="providers.E001")
            for problem in check_providers_configured()]

from django.apps import AppConfig
from django.core import checks


class ProvidersConfig(AppConfig):
    name = "providers"
    verbose_name = "Providers"

    def ready(self) -> None:
        checks.register(check_providers, checks.Tags.compatibility)
        checks.register(check_isolation, checks.Tags.compatibility)
        checks.register(check_emulator_mode, checks.Tags.security, deploy=True)


def check_providers(app_configs=None, **kwargs):
    """System check: ``settings.PROVIDERS`` is complete (run by `manage.py check`, runserver, tests)."""
    from providers.registry import check_providers_configured

    hint = ("See docs/OPERATIONS.md, section Configuration. A channel this deployment does not use: set its list "
            "empty (PUSH_PROVIDERS= (empty): no push provider, and sends on push are refused).")
    return [checks.Error(problem, hint=hint, id="providers.E001") for problem in check_providers_configured()]


def check_isolation(app_configs=None, **kwargs):
    """System check: budgets, breakers, bulkheads, batch sizes and leases are in range (a rate of 0
    or a bulkhead of 0 would stall delivery silently)."""
    from providers.isolation import check_isolation_settings

    return [checks.Error(problem, hint="See docs/OPERATIONS.md, section Configuration.", id="providers.E002")
            for problem in check_isolation_settings()]


def check_emulator_mode(app_configs=None, **kwargs):
    """Deploy check (``manage.py check --deploy``): emulator mode outside local development. Every
    provider without credentials of its own is then the local emulator, and webhooks signed with its
    public built-in credentials (in this repository) are accepted: anyone can forge a receipt."""
    from django.conf import settings

    if getattr(settings, "LOCAL_DEVELOPMENT", False) or getattr(settings, "PROVIDER_MODE", "real") != "emulator":
        return []
    env = getattr(settings, "NOTIFY_ENV", "production")
    return [checks.Warning(f"PROVIDER_MODE=emulator outside local development (NOTIFY_ENV={env}): providers "
                           "without credentials of their own are the emulator, and webhooks signed with its public "
                           "built-in credentials are accepted",
                           hint="Unset PROVIDER_MODE (real is the default outside local development) and give "
                                "every listed provider its credentials (docs/SECURITY.md › Emulator mode).",
                           id="providers.W001")]

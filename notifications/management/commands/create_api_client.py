"""``manage.py create_api_client NAME [--scopes a,b,…] [--allow-high] [--rate-limit 600/min]``: prints
the new key as the last line of output. The key is shown only once; only its hash is stored.

Without ``--scopes`` the client gets :data:`core.api.scopes.DEFAULT_SCOPES` (``notifications:send``,
``read``: a service that sends and reads the outcome). ``--allow-high`` adds
``notifications:send_high`` to whichever scopes were given.
"""

from django.core.management.base import BaseCommand, CommandError

from core.api.scopes import DEFAULT_SCOPES, Scope, canonical, parse_scopes
from notifications.api.throttling import ApiClientRateThrottle
from notifications.models import APIClient


class Command(BaseCommand):
    help = "Create an API client and print its API key (last line of output)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Name of the calling service, e.g. auth-service.")
        parser.add_argument("--scopes", default=None,
                            help=f"Comma-separated scopes ({', '.join(Scope.values)}); "
                                 f"default: {','.join(DEFAULT_SCOPES)}.")
        parser.add_argument("--allow-high", action="store_true",
                            help="Also grant notifications:send_high (priority=high: OTPs, alerts).")
        parser.add_argument("--rate-limit", default="", help='DRF rate such as "600/min"; default: platform default.')

    def handle(self, *args, name, scopes, allow_high, rate_limit, **options):
        if rate_limit:
            try:
                ApiClientRateThrottle().parse_rate(rate_limit)
            except (ValueError, KeyError, AttributeError):
                raise CommandError(f'--rate-limit "{rate_limit}" is not like "600/min"') from None
        try:
            granted = list(DEFAULT_SCOPES) if scopes is None else parse_scopes(scopes)
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        if allow_high:
            granted = canonical([*granted, Scope.SEND_HIGH])
        client, key = APIClient.objects.create_key(name=name, scopes=granted, rate_limit=rate_limit)
        shown = ", ".join(granted) or "none"
        self.stdout.write(f"Created API client '{name}' (prefix {client.prefix}, scopes {shown}). "
                          "Store the key now; it is not shown again:")
        self.stdout.write(key)

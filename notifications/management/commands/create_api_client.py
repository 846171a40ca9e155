"""``manage.py create_api_client NAME [--allow-high] [--rate-limit 600/min]``: prints the new key
as the last line of output. The key is shown only once; only its hash is stored."""

from django.core.management.base import BaseCommand, CommandError

from notifications.api.throttling import ApiClientRateThrottle
from notifications.models import APIClient


class Command(BaseCommand):
    help = "Create an API client and print its API key (last line of output)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Name of the calling service, e.g. auth-service.")
        parser.add_argument("--allow-high", action="store_true", help="Allow priority=high (OTPs, alerts).")
        parser.add_argument("--rate-limit", default="", help='DRF rate such as "600/min"; default: platform default.')

    def handle(self, *args, name, allow_high, rate_limit, **options):
        if rate_limit:
            try:
                ApiClientRateThrottle().parse_rate(rate_limit)
            except (ValueError, KeyError, AttributeError):
                raise CommandError(f'--rate-limit "{rate_limit}" is not like "600/min"') from None
        client, key = APIClient.objects.create_key(name=name, allow_high=allow_high, rate_limit=rate_limit)
        self.stdout.write(f"Created API client '{name}' (prefix {client.prefix}, "
                          f"high priority {'allowed' if allow_high else 'not allowed'}). "
                          "Store the key now; it is not shown again:")
        self.stdout.write(key)

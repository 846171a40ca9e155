"""``manage.py create_api_client NAME [--scopes a,b,…] [--allow-high] [--rate-limit 600/min] [--rotate]``:
prints the new key as the last line of output. The key is shown only once; only its hash is stored.

Without ``--scopes``: :data:`core.api.scopes.DEFAULT_SCOPES`; ``--allow-high`` adds
``notifications:send_high``. Names are unique (a second client of one name would own nothing of the
first's and look the same everywhere). ``--rotate`` gives the existing client NAME a new secret
(same row and prefix; the old key stops at once), keeping scopes and rate limit unless given.
docs/API.md, "Authentication and scopes".
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.api.scopes import DEFAULT_SCOPES, Scope, canonical, parse_scopes
from notifications.api.throttling import ApiClientRateThrottle
from notifications.models import APIClient


class Command(BaseCommand):
    help = "Create an API client (or --rotate an existing one's key) and print its API key (last line)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="Name of the calling service, e.g. auth-service.")
        parser.add_argument("--scopes", default=None,
                            help=f"Comma-separated scopes ({', '.join(Scope.values)}); "
                                 f"default: {','.join(DEFAULT_SCOPES)} (with --rotate: the client's own).")
        parser.add_argument("--allow-high", action="store_true",
                            help="Also grant notifications:send_high (priority=high: OTPs, alerts).")
        parser.add_argument("--rate-limit", default="", help='DRF rate such as "600/min"; default: platform default.')
        parser.add_argument("--rotate", action="store_true",
                            help="Give the existing client NAME a new key; its old key stops working.")

    def handle(self, *args, name, scopes, allow_high, rate_limit, rotate, **options):
        if rate_limit:
            try:
                ApiClientRateThrottle().parse_rate(rate_limit)
            except (ValueError, KeyError, AttributeError):
                raise CommandError(f'--rate-limit "{rate_limit}" is not like "600/min"') from None
        try:
            granted = None if scopes is None else parse_scopes(scopes)
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        with transaction.atomic():
            if rotate:
                client, key = self.rotate(name, granted, allow_high, rate_limit)
            else:
                if APIClient.objects.filter(name=name).exists():
                    raise CommandError(f"an API client named '{name}' already exists; to replace its key "
                                       f"(the old one stops working): create_api_client {name} --rotate")
                granted = list(DEFAULT_SCOPES) if granted is None else granted
                if allow_high:
                    granted = canonical([*granted, Scope.SEND_HIGH])
                client, key = APIClient.objects.create_key(name=name, scopes=granted, rate_limit=rate_limit)
        shown = ", ".join(client.scopes) or "none"
        done = "New key for" if rotate else "Created"
        self.stdout.write(f"{done} API client '{name}' (prefix {client.prefix}, scopes {shown}). "
                          "Store the key now; it is not shown again:")
        self.stdout.write(key)

    @staticmethod
    def rotate(name: str, granted: list[str] | None, allow_high: bool, rate_limit: str) -> tuple[APIClient, str]:
        """A new secret for the one unrevoked client ``name``, under its prefix (so its id, admin URL
        and history stay; the library keys by prefix and checks the hash, as after its own rehash)."""
        clients = list(APIClient.objects.select_for_update().filter(name=name, revoked=False))
        if not clients:
            revoked = APIClient.objects.filter(name=name).exists()
            raise CommandError(f"API client '{name}' is revoked, which cannot be undone; create one under "
                               f"another name" if revoked else f"no API client named '{name}' to rotate")
        if len(clients) > 1:
            prefixes = ", ".join(sorted(c.prefix for c in clients))
            raise CommandError(f"{len(clients)} API clients are named '{name}' (prefixes {prefixes}); "
                               "revoke all but one in the admin, then rotate")
        (client,) = clients
        generator = APIClient.objects.key_generator
        key = f"{client.prefix}.{generator.get_secret_key()}"
        client.hashed_key = generator.hash(key)
        if granted is not None:
            client.scopes = granted
        if allow_high:
            client.allow_high = True
        if rate_limit:
            client.rate_limit = rate_limit
        client.save(update_fields=["hashed_key", "scopes", "rate_limit"])
        return client, key

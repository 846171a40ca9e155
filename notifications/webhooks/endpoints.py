"""Creating and removing an API client's webhook endpoints (``/v1/webhook-endpoints``, the admin).

The signing secret is made here, once: ``whsec_`` + base64 of 24 random bytes, the Standard
Webhooks format its reference library reads (``Webhook("whsec_…")``).
"""

from __future__ import annotations

import base64
import secrets

from django.conf import settings

from notifications.models import APIClient
from notifications.webhooks import retention
from notifications.webhooks.models import WebhookEndpoint


class TooMany(Exception):
    """The client has ``WEBHOOKS["MAX_ENDPOINTS_PER_CLIENT"]`` endpoints already."""


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def create(client: APIClient, url: str, events: list[str], description: str = "") -> WebhookEndpoint:
    """A new active endpoint of ``client`` (url and events validated by the caller); raises TooMany."""
    limit = settings.WEBHOOKS["MAX_ENDPOINTS_PER_CLIENT"]
    if WebhookEndpoint.objects.filter(client=client).count() >= limit:
        raise TooMany(f"at most {limit} endpoints per API client; delete one first")
    return WebhookEndpoint.objects.create(client=client, url=url, events=list(dict.fromkeys(events)),
                                          description=description, secret=new_secret())


def delete(endpoint: WebhookEndpoint) -> None:
    """The endpoint and its deliveries (pending ones are never sent), set-based."""
    retention.delete_endpoint(endpoint)

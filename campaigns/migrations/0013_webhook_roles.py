"""Staff roles for status webhooks (issue 26, ``notifications.WebhookEndpoint``/``WebhookDelivery``/
``WebhookAttempt``): ``support`` reads endpoints, deliveries and attempts and may replay a delivery
(``notifications.replay_webhookdelivery``, created here). No group adds, changes or deletes
endpoints: a client creates its own through the API (only it can receive the secret); superusers
disable or re-enable one in the admin.

The lists are a frozen copy of :mod:`campaigns.roles` as of this migration; ``sync`` is the one of
``0007``. Reversing puts back 0011's.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("campaigns.migrations.0007_notification_types_and_events")
_0011 = importlib.import_module("campaigns.migrations.0011_sender_allowlist_roles")
CUSTOM_PERMISSIONS = [*_0007.CUSTOM_PERMISSIONS,
                      ("notifications", "webhookdelivery", "replay_webhookdelivery", "Can replay webhook deliveries")]

GROUP_PERMISSIONS = {
    "marketing": list(_0011.GROUP_PERMISSIONS["marketing"]),
    "product": list(_0011.GROUP_PERMISSIONS["product"]),
    "support": [*_0011.GROUP_PERMISSIONS["support"], "notifications.view_webhookendpoint",
                "notifications.view_webhookdelivery", "notifications.view_webhookattempt",
                "notifications.replay_webhookdelivery"],
}


def sync(apps, using):
    """0007's sync with these groups and permissions (idempotent; tests re-apply it after a flush)."""
    saved = _0007.GROUP_PERMISSIONS, _0007.CUSTOM_PERMISSIONS
    _0007.GROUP_PERMISSIONS, _0007.CUSTOM_PERMISSIONS = GROUP_PERMISSIONS, CUSTOM_PERMISSIONS
    try:
        _0007.sync(apps, using)
    finally:
        _0007.GROUP_PERMISSIONS, _0007.CUSTOM_PERMISSIONS = saved


def apply(apps, schema_editor):
    sync(apps, schema_editor.connection.alias)


def revert(apps, schema_editor):
    _0011.sync(apps, schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0012_keyed_request_fingerprint"),
        ("notifications", "0041_webhook_endpoints"),
    ]

    operations = [migrations.RunPython(apply, revert)]

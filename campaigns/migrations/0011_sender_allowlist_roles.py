"""Staff roles for the sender allow-list (issue 23 #10, ``notifications.AllowedSender``): ``product``
reads it (``notifications.view_allowedsender``); no group may add, change or delete entries
(superusers only, see :mod:`campaigns.roles`). Marketing and support get nothing of it.

The lists are a frozen copy of :mod:`campaigns.roles` as of this migration; ``sync`` is the one of
``0007``. Reversing puts back 0010's.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("campaigns.migrations.0007_notification_types_and_events")
_0010 = importlib.import_module("campaigns.migrations.0010_inbox_roles")
CUSTOM_PERMISSIONS = _0007.CUSTOM_PERMISSIONS

GROUP_PERMISSIONS = {
    "marketing": list(_0010.GROUP_PERMISSIONS["marketing"]),
    "product": [*_0010.GROUP_PERMISSIONS["product"], "notifications.view_allowedsender"],
    "support": list(_0010.GROUP_PERMISSIONS["support"]),
}


def sync(apps, using):
    """0007's sync with these groups (idempotent; tests re-apply it after a flush)."""
    saved = _0007.GROUP_PERMISSIONS
    _0007.GROUP_PERMISSIONS = GROUP_PERMISSIONS
    try:
        _0007.sync(apps, using)
    finally:
        _0007.GROUP_PERMISSIONS = saved


def apply(apps, schema_editor):
    sync(apps, schema_editor.connection.alias)


def revert(apps, schema_editor):
    _0010.sync(apps, schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0010_inbox_roles"),
        ("notifications", "0025_sender_allowlist"),
    ]

    operations = [migrations.RunPython(apply, revert)]

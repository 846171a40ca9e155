"""Staff roles for the in-app inbox (issue 16): ``support`` reads a user's inbox items with their
seen/read/archived state, and the badge counts shown with them (``notifications.view_inboxitem``).
Marketing and product get nothing of it.

The lists are a frozen copy of :mod:`campaigns.roles` as of this migration; ``sync`` is the one of
``0007``. Reversing puts back 0008's.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("campaigns.migrations.0007_notification_types_and_events")
_0008 = importlib.import_module("campaigns.migrations.0008_policy_pages")
CUSTOM_PERMISSIONS = _0007.CUSTOM_PERMISSIONS

GROUP_PERMISSIONS = {
    "marketing": list(_0008.GROUP_PERMISSIONS["marketing"]),
    "product": list(_0008.GROUP_PERMISSIONS["product"]),
    "support": [*_0008.GROUP_PERMISSIONS["support"], "notifications.view_inboxitem"],
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
    _0008.sync(apps, schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0009_inbox"),
        ("notifications", "0022_inbox"),
    ]

    operations = [migrations.RunPython(apply, revert)]

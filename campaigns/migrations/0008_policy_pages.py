"""Staff roles for the policies of issue 15: ``product`` manages frequency caps (they are per
category and channel, like the types it defines) and reads the abuse limits; ``support`` reads caps,
limits and unsubscribes (to explain a ``frequency_capped`` row, a 429 or an opt-out); ``marketing``
reads caps (what bounds a campaign) and unsubscribes (what a campaign cost). Changing an abuse limit
stays with superusers (a security control: granted to a person, not a role). Digests are read with
``view_event`` (support already has it).

The lists are a frozen copy of :mod:`campaigns.roles` as of this migration; ``sync`` is the one of
``0007``. Reversing puts back 0007's.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("campaigns.migrations.0007_notification_types_and_events")
CUSTOM_PERMISSIONS = _0007.CUSTOM_PERMISSIONS


def _manage(app_label, *models):
    return [f"{app_label}.{action}_{model}" for model in models for action in ("add", "change", "delete", "view")]


GROUP_PERMISSIONS = {
    "marketing": [
        *_manage("campaigns", "segment", "segmentmember", "template", "templatevariant", "campaign"),
        "preferences.view_recipient",
        "preferences.view_unsubscribe",
        "notifications.view_frequencycap",
    ],
    "product": [
        *_manage("notifications", "notificationtype", "typetemplate", "frequencycap"),
        "preferences.view_recipient",
        "notifications.view_acceptancelimit",
    ],
    "support": [
        "preferences.view_recipient",
        "preferences.view_device",
        "preferences.view_preferences",
        "preferences.add_preferences",
        "preferences.change_preferences",
        "notifications.view_notification",
        "notifications.view_deliveryattempt",
        "notifications.view_deliveryevent",
        "notifications.view_deadletter",
        "notifications.replay_deadletter",
        "notifications.view_apiauditentry",
        "notifications.view_event",
        "notifications.view_notificationtype",
        "notifications.view_typetemplate",
        "preferences.view_unsubscribe",
        "notifications.view_frequencycap",
        "notifications.view_acceptancelimit",
    ],
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
    _0007.sync(apps, schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0007_notification_types_and_events"),
        ("notifications", "0020_merge_caps_limits_digests"),
        ("preferences", "0006_unsubscribes"),
    ]

    operations = [migrations.RunPython(apply, revert)]

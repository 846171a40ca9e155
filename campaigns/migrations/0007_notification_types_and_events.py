"""Staff roles for notification types and events (issue 14): a new ``product`` group defines types
and their templates; ``support`` also reads events and types; the permission
``notifications.define_high_priority_type`` (no group has it) guards high-priority types.

The lists are a frozen copy of :mod:`campaigns.roles` as of this migration (a migration must not
import code that changes later); ``sync`` is the one of ``0002_staff_groups``. A group that already
exists under one of these names gets exactly these permissions; reversing puts back 0005's and
removes the ``product`` group and the new permission.
"""

import importlib

from django.contrib.auth.management import create_permissions
from django.db import migrations

APPS = ["preferences", "notifications", "campaigns"]

CUSTOM_PERMISSIONS = [
    # (app_label, model, codename, name)
    ("campaigns", "campaign", "send_high_priority", "Can send campaigns with high priority"),
    ("notifications", "deadletter", "replay_deadletter", "Can replay dead letters"),
    ("notifications", "notificationtype", "define_high_priority_type",
     "Can define and change high-priority notification types"),
]


def _manage(app_label, *models):
    return [f"{app_label}.{action}_{model}" for model in models for action in ("add", "change", "delete", "view")]


GROUP_PERMISSIONS = {
    "marketing": [
        *_manage("campaigns", "segment", "segmentmember", "template", "templatevariant", "campaign"),
        "preferences.view_recipient",
    ],
    "product": [
        *_manage("notifications", "notificationtype", "typetemplate"),
        "preferences.view_recipient",
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
    ],
}


def sync(apps, using):
    """Create the permissions and groups (idempotent). ``apps`` may be the migration state's or the
    project's registry (tests re-apply it after a flush)."""
    # Default permissions are normally created after `migrate` (post_migrate): create them now so the
    # groups can be filled on a fresh database.
    for label in APPS:
        app_config = apps.get_app_config(label)
        saved = getattr(app_config, "models_module", None)  # a migration state's AppConfigStub has none
        app_config.models_module = saved or True  # create_permissions skips apps without a models module
        try:
            create_permissions(app_config, verbosity=0, using=using, apps=apps)
        finally:
            app_config.models_module = saved

    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    for app_label, model, codename, name in CUSTOM_PERMISSIONS:
        content_type, _ = ContentType.objects.using(using).get_or_create(app_label=app_label, model=model)
        Permission.objects.using(using).get_or_create(content_type=content_type, codename=codename,
                                                      defaults={"name": name})

    for group_name, wanted in GROUP_PERMISSIONS.items():
        permissions = []
        for dotted in wanted:
            app_label, codename = dotted.split(".", 1)
            permissions.append(Permission.objects.using(using).get(content_type__app_label=app_label,
                                                                   codename=codename))
        group, _ = Group.objects.using(using).get_or_create(name=group_name)
        group.permissions.set(permissions)


def apply(apps, schema_editor):
    sync(apps, schema_editor.connection.alias)


def revert(apps, schema_editor):
    using = schema_editor.connection.alias
    importlib.import_module("campaigns.migrations.0005_support_reads_api_audit_log").sync(apps, using)
    apps.get_model("auth", "Group").objects.using(using).filter(name="product").delete()
    apps.get_model("auth", "Permission").objects.using(using).filter(
        content_type__app_label="notifications", content_type__model="notificationtype",
        codename="define_high_priority_type").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0006_campaign_notification_type"),
        ("notifications", "0016_notification_types_and_events"),
    ]

    operations = [migrations.RunPython(apply, revert)]

"""A campaign's stored plain idempotency fingerprint becomes the keyed one, as notifications' and
events' do in notifications/migrations/0036 (whose frozen ``rewrite`` this uses)."""

import importlib

from django.db import migrations

_0036 = importlib.import_module("notifications.migrations.0036_keyed_request_fingerprint")


def to_keyed(apps, schema_editor):
    _0036.rewrite(apps.get_model("campaigns", "Campaign"), schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ("campaigns", "0011_sender_allowlist_roles"),
        ("notifications", "0036_keyed_request_fingerprint"),
    ]

    operations = [
        migrations.RunPython(to_keyed, migrations.RunPython.noop),
    ]

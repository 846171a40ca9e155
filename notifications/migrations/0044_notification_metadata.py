"""The client's own ``metadata`` of a send (docs/API.md): a column on the live table, the history
(a partitioned table: its partitions take it) and the view of both, remade with it."""

from django.db import migrations, models

from notifications.migrations._history_sql import HISTORY, VIEW, recreate_view


def history_and_view(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {HISTORY} ADD COLUMN metadata jsonb NULL")
        recreate_view(cur)


def drop_from_history(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"DROP VIEW IF EXISTS {VIEW}")
        cur.execute(f"ALTER TABLE {HISTORY} DROP COLUMN metadata")


def view_again(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        recreate_view(cur)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0043_webhook_endpoint_lease'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, view_again),  # backwards: after the live column went
        migrations.AddField(
            model_name='notification',
            name='metadata',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(history_and_view, drop_from_history),
    ]

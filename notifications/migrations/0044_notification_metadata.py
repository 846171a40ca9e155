"""A send's free-form ``metadata`` (notifications/metadata.py): a nullable column on the live table,
the same on the partitioned history (the archiver moves every live column), and the view of both
made again with it (notifications/migrations/_history_sql.py)."""

from django.db import migrations, models

from notifications.migrations._history_sql import HISTORY, VIEW, recreate_view


def drop_view(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"DROP VIEW IF EXISTS {VIEW}")


def make_view(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        recreate_view(cur)


def forwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"ALTER TABLE {HISTORY} ADD COLUMN IF NOT EXISTS metadata jsonb NULL")
        recreate_view(cur)


def backwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"DROP VIEW IF EXISTS {VIEW}; ALTER TABLE {HISTORY} DROP COLUMN IF EXISTS metadata")


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0043_webhook_endpoint_lease"),
    ]

    operations = [
        migrations.RunPython(drop_view, make_view),  # the view reads every live column: made again below
        migrations.AddField(
            model_name="notification",
            name="metadata",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(forwards, backwards),
    ]

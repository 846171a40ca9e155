"""The admin log records an API client under its prefix (issue 23 #9): the admin addresses clients by
prefix, and the id (``prefix.<hash of the key>``) is shown nowhere. Existing entries are rewritten
from the id to its prefix (the part before the first "."), so their links and the History page keep
working and no longer show the hash."""

from django.db import migrations


def to_prefix(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    LogEntry = apps.get_model("admin", "LogEntry")
    db = schema_editor.connection.alias
    kind = ContentType.objects.using(db).filter(app_label="notifications", model="apiclient").first()
    if kind is None:
        return
    for entry in LogEntry.objects.using(db).filter(content_type=kind, object_id__contains="."):
        entry.object_id = entry.object_id.split(".", 1)[0]
        entry.save(update_fields=["object_id"])


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0025_receipts_scope"),
        ("admin", "0003_logentry_add_action_flag_choices"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(to_prefix, migrations.RunPython.noop),
    ]

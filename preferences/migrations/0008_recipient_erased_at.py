"""Recipient.erased_at: the latest erasure's instant, backfilled from the erasure records."""

from django.db import migrations, models
from django.db.models import Max, OuterRef, Subquery


def backfill(apps, schema_editor):
    Recipient, Erasure = apps.get_model("preferences", "Recipient"), apps.get_model("preferences", "Erasure")
    latest = Erasure.objects.filter(recipient=OuterRef("pk")).values("recipient").annotate(at=Max("erased_at"))
    Recipient.objects.filter(pk__in=Erasure.objects.values("recipient")).update(erased_at=Subquery(latest.values("at")))


class Migration(migrations.Migration):

    dependencies = [
        ("preferences", "0007_inbox"),
    ]

    operations = [
        migrations.AddField(
            model_name="recipient",
            name="erased_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]

"""When the upstream service last wrote a recipient (docs/SEGMENTS.md: a recipient written after its
erasure is a re-created user and matches rule segments again). Recipients already re-created (saved
after their erasure: only PUT /v1/users saves an erased row after the erasure's own save) take their
updated_at."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('preferences', '0009_recipient_rule_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='recipient',
            name='written_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.RunSQL("UPDATE preferences_recipient SET written_at = updated_at "
                          "WHERE erased_at IS NOT NULL AND updated_at > erased_at", migrations.RunSQL.noop),
    ]

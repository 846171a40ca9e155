"""The locale rule of rule segments is case-insensitive (BCP 47 tags are: "DE" matches "de-DE";
docs/SEGMENTS.md): recipient_locale_idx becomes an index on lower(locale). Built CONCURRENTLY under
a new name, the old one dropped CONCURRENTLY, then renamed: recipient writes go on, and the rule
always has an index. Written in SQL: Django renders an operator class on an expression only with
django.contrib.postgres installed, which this project does not install; the state is the model's."""

import django.contrib.postgres.indexes
import django.db.models.functions.text
from django.db import migrations, models

NEW = ("CREATE INDEX CONCURRENTLY IF NOT EXISTS recipient_locale_ci_idx "
       "ON preferences_recipient ((lower(locale)) text_pattern_ops)")
OLD = ("CREATE INDEX CONCURRENTLY IF NOT EXISTS recipient_locale_old_idx "
       "ON preferences_recipient (locale varchar_pattern_ops)")


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('preferences', '0010_recipient_written_at'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(NEW, "DROP INDEX CONCURRENTLY IF EXISTS recipient_locale_ci_idx"),
                migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS recipient_locale_idx",
                                  [OLD, "ALTER INDEX recipient_locale_old_idx RENAME TO recipient_locale_idx"]),
                migrations.RunSQL("ALTER INDEX recipient_locale_ci_idx RENAME TO recipient_locale_idx",
                                  "ALTER INDEX recipient_locale_idx RENAME TO recipient_locale_ci_idx"),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name='recipient', name='recipient_locale_idx'),
                migrations.AddIndex(
                    model_name='recipient',
                    index=models.Index(django.contrib.postgres.indexes.OpClass(
                        django.db.models.functions.text.Lower('locale'), name='text_pattern_ops'),
                        name='recipient_locale_idx')),
            ],
        ),
    ]

"""Rule segments test `attributes @> {"tier": "t7"}`. Postgres estimates that from the column's most
common values and its histogram; with the default statistics target (100) a value outside both is
guessed at 1 % of the recipients, which on a million makes a selective rule look broad and picks a
full pass over the devices (docs/SEGMENTS.md, "What a rule costs"). A target of 1000 samples 300,000
rows: ANALYZE reads more, the rule's plan follows what the recipients hold."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('preferences', '0011_recipient_locale_any_case'),
    ]

    operations = [
        migrations.RunSQL("ALTER TABLE preferences_recipient ALTER COLUMN attributes SET STATISTICS 1000",
                          "ALTER TABLE preferences_recipient ALTER COLUMN attributes SET STATISTICS -1"),
    ]

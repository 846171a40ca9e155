"""Rule segments' indexes on recipients (docs/SEGMENTS.md, "What a rule costs"): attribute
containment and key existence (GIN), and a locale or its subtags (= and LIKE 'de-%'); built without
locking recipient writes."""

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('preferences', '0008_recipient_erased_at'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='recipient',
            index=django.contrib.postgres.indexes.GinIndex(fields=['attributes'], name='recipient_attributes_gin'),
        ),
        AddIndexConcurrently(
            model_name='recipient',
            index=models.Index(fields=['locale'], name='recipient_locale_idx', opclasses=['varchar_pattern_ops']),
        ),
    ]

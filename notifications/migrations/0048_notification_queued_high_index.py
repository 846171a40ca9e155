# /metrics reads the oldest queued high-tier row (notify_queued_oldest_age_seconds{tier="high"}, the
# HighPriorityRowsWaiting alert) by this index, never past the standard rows a campaign queues. Built
# concurrently: the live table is written on every status move.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('notifications', '0047_provider_minutes'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('priority', 'high'), ('status', 'queued')), fields=['queued_at'],
                               name='notification_queued_high_idx'),
        ),
    ]

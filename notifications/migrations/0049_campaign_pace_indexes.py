"""A campaign's pace reads the rows it sent in the current minute (the sampler's due → sent latency)
and its last scheduled send through these, each bounded by those rows instead of the campaign's
size (docs/CAMPAIGNS.md, "Pace"; what they cost on the send path: docs/PERFORMANCE.md, "The pace
sampler"). Built concurrently: the table is written on every status move."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('notifications', '0048_notification_queued_high_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('campaign_id__isnull', False), ('sent_at__isnull', False)),
                               fields=['campaign_id', 'sent_at'], name='notification_campaign_sent_idx'),
        ),
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('campaign_id__isnull', False), ('status', 'scheduled')),
                               fields=['campaign_id', 'due_at'], name='notification_campaign_due_idx'),
        ),
    ]

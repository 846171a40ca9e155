# Erasure finds the webhook deliveries of a user's notifications by this index. Built concurrently:
# the outbox is written on every status move, and a plain CREATE INDEX would block those writes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('notifications', '0045_merge_metadata_and_send_time'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('notification_id__isnull', False)), fields=['notification_id'],
                               name='webhook_notification_idx'),
        ),
    ]

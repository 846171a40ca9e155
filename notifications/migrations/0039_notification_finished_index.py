"""The archiver's index: finished rows by their last change, built without locking writes."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('notifications', '0038_notification_archive'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('dead_lettered_at__isnull', True), ('status__in', ('sent', 'delivered', 'displayed', 'dismissed', 'opened', 'failed', 'suppressed', 'expired', 'cancelled'))), fields=['updated_at'], name='notification_finished_idx'),
        ),
    ]

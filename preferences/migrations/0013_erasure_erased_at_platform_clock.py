"""Erasure.erased_at on the platform clock (core.clock), as every instant the platform stamps; it was
auto_now_add, the host's. No change in the database."""

import core.clock
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('preferences', '0012_recipient_attributes_statistics'),
    ]

    operations = [
        migrations.AlterField(
            model_name='erasure',
            name='erased_at',
            field=models.DateTimeField(default=core.clock.now, editable=False),
        ),
    ]

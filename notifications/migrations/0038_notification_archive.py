"""The archive (docs/ARCHITECTURE.md, "Where a row lives"): the history as a model for the
lifecycle's writes, archived rows read as notifications, and no FK constraint from the delivery log
or the inbox to the live table (a row's notification may have moved to the history)."""

import core.clock
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0037_notification_history'),
        ('preferences', '0008_recipient_erased_at'),
    ]

    operations = [
        migrations.CreateModel(
            name='NotificationHistory',
            fields=[
                ('id', models.UUIDField(editable=False, primary_key=True, serialize=False)),
                ('idempotency_key', models.CharField(blank=True, max_length=255, null=True)),
                ('request_fingerprint', models.CharField(blank=True, default='', help_text='Keyed hash (HMAC) of the canonical request body.', max_length=64)),
                ('campaign_id', models.UUIDField(blank=True, db_index=True, null=True)),
                ('fallback_after', models.UUIDField(blank=True, help_text='Fallback routing: the notification of the channel before this one; this one waits until that one cannot reach the recipient.', null=True)),
                ('channel', models.CharField(choices=[('sms', 'SMS'), ('email', 'Email'), ('push', 'Push'), ('in_app', 'In-app inbox')], max_length=8)),
                ('priority', models.CharField(choices=[('high', 'High (OTP, security)'), ('standard', 'Standard')], default='standard', max_length=8)),
                ('category', models.CharField(blank=True, default='', max_length=64)),
                ('title', models.CharField(blank=True, default='', max_length=998)),
                ('body', models.TextField()),
                ('html', models.TextField(blank=True, default='')),
                ('data', models.JSONField(blank=True, null=True)),
                ('sensitive', models.BooleanField(default=False, help_text='Content (e.g. an OTP) is never shown or logged.')),
                ('limit_contact', models.CharField(blank=True, db_default='', default='', max_length=16)),
                ('status', models.CharField(choices=[('scheduled', 'Scheduled'), ('queued', 'Queued'), ('sending', 'Sending'), ('sent', 'Sent'), ('delivered', 'Delivered'), ('displayed', 'Displayed (app)'), ('dismissed', 'Dismissed (app)'), ('opened', 'Opened (app)'), ('failed', 'Failed'), ('suppressed', 'Suppressed'), ('expired', 'Expired'), ('cancelled', 'Cancelled')], default='queued', max_length=12)),
                ('reason', models.CharField(blank=True, choices=[('opted_out_channel', 'Recipient opted out of this channel'), ('opted_out_category', 'Recipient opted out of this category on this channel'), ('no_phone', 'Recipient has no phone number'), ('no_email', 'Recipient has no email address'), ('no_active_device', 'Recipient has no active push device'), ('phone_invalid', 'Phone number marked invalid by the provider'), ('email_invalid', 'Email address marked invalid by the provider'), ('quiet_hours', "Deferred: recipient's quiet hours"), ('ttl_expired', 'Time to live ran out before it could be sent'), ('cancelled_by_client', 'Cancelled through the API'), ('campaign_cancelled', 'Its campaign was cancelled'), ('recipient_erased', "Cancelled: the recipient's personal data was erased (DELETE /v1/users/{id}) before it was sent"), ('local_time_passed', "The campaign's local send time had already passed in the recipient's zone when it fanned out (missed_policy skip)"), ('template_error', 'The template could not be rendered'), ('sms_stopped', 'Recipient replied STOP to this sender'), ('provider_undelivered', 'Provider reported it undelivered (receipt)'), ('provider_bounced', 'Email bounced or was dropped (receipt)'), ('contact_invalid', 'Provider said the address/number/token is invalid'), ('permanent_error', 'Provider refused the message permanently'), ('configuration_error', 'Provider configuration error'), ('attempts_exhausted', 'Transient errors until the attempt budget ran out'), ('retry_scheduled', 'Transient provider error; retry scheduled'), ('outcome_unknown', 'The provider did not answer in time: it may have accepted the message, so it is looked up or waited for before any re-send'), ('lease_expired', 'The worker sending it stopped renewing its lease (killed or stalled); re-driven after a wait, as its call may have been made'), ('worker_error', 'The worker failed on this notification (a bug); retried a bounded number of times'), ('opted_out_type', 'Recipient opted out of this notification type on this channel'), ('fallback_waiting', "Waits for the channel before it in its type's fallback order: sent only if that one cannot reach the recipient"), ('fallback_not_needed', "Not sent: a channel before it in its type's fallback order reached the recipient"), ('worker_lost', 'Its worker died or stalled on it repeatedly (poison message): dead-lettered after the attempt budget'), ('frequency_capped', 'Not sent: the recipient already got as many of this category on this channel as a frequency cap allows in its window'), ('acceptance_limited', 'Not sent: the recipient (or its phone or address) was over an abuse limit when its campaign fanned out (docs/POLICIES.md)'), ('high_not_allowed', "Not sent: a high-priority type's content, and the campaign's API key lacks notifications:send_high"), ('not_for_campaigns', "Not sent: its campaign's type overrides users' choices (required, quiet hours bypass) or is a digest type, which no campaign may send")], default='', max_length=32)),
                ('reason_detail', models.CharField(blank=True, default='', max_length=500)),
                ('accepted_status', models.CharField(blank=True, default='', help_text='Status returned by the accepting request (replayed).', max_length=12)),
                ('scheduled_at', models.DateTimeField(blank=True, help_text='Requested send time (UTC).', null=True)),
                ('due_at', models.DateTimeField(blank=True, null=True)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('queued_at', models.DateTimeField(blank=True, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('claims', models.PositiveIntegerField(db_default=0, default=0)),
                ('first_attempt_at', models.DateTimeField(blank=True, null=True)),
                ('provider', models.CharField(blank=True, default='', max_length=32)),
                ('provider_message_id', models.CharField(blank=True, default='', max_length=255)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('dead_lettered_at', models.DateTimeField(blank=True, help_text='Set when it failed for a reason a person must look at (attempts ran out, our config).', null=True)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('receipt_at', models.DateTimeField(blank=True, null=True)),
                ('receipt_rank', models.PositiveSmallIntegerField(db_default=0, default=0)),
                ('created_at', models.DateTimeField(default=core.clock.now, editable=False)),
                ('updated_at', models.DateTimeField(default=core.clock.now, editable=False)),
            ],
            options={
                'db_table': 'notifications_notificationhistory',
                'managed': False,
            },
        ),
        migrations.CreateModel(
            name='ArchivedNotification',
            fields=[
            ],
            options={
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('notifications.notification',),
        ),
        migrations.AlterField(
            model_name='deliveryattempt',
            name='notification',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts_log', to='notifications.notification'),
        ),
        migrations.AlterField(
            model_name='deliveryevent',
            name='notification',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='notifications.notification'),
        ),
        migrations.AlterField(
            model_name='inboxitem',
            name='notification',
            field=models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='inbox_item', serialize=False, to='notifications.notification'),
        ),
    ]

"""A campaign records what its snapshot is (docs/SEGMENTS.md, "When membership is decided"): fan-out
pages read it, not the segment's kind now. Campaigns already snapshotted take their segment's kind
today (the best guess; one changed mid fan-out before this was already misread)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0019_campaign_minutes'),
    ]

    operations = [
        migrations.AddField(
            model_name='campaign',
            name='snapshot_kind',
            field=models.CharField(blank=True, choices=[('list', 'list'), ('rule', 'rule')], default='', help_text="What the snapshot is, decided when it is taken: a list segment's members added up to snapshot_at, or a rule segment's matches (campaign members), whatever the segment became since. Empty before the snapshot.", max_length=4),
        ),
        migrations.RunSQL(
            "UPDATE campaigns_campaign c SET snapshot_kind = CASE WHEN s.rules IS NULL THEN 'list' ELSE 'rule' END "
            "FROM campaigns_segment s WHERE s.segment_id = c.segment_id AND c.snapshot_at IS NOT NULL",
            migrations.RunSQL.noop),
    ]

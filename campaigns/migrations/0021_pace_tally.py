"""Beat's pace sampler keeps each sampled campaign's counts from what changed instead of counting all
its rows every 15 s (docs/CAMPAIGNS.md, "Pace"; campaigns/tally.py; what it costs:
docs/PERFORMANCE.md, "The pace sampler").

Statement-level triggers on the notifications (INSERT and UPDATE of the live table, UPDATE of the
history, which the archiver only INSERTs into) append, in the writer's own transaction, what the
statement changed in each campaign's counts: per (campaign, status, reason) the rows gained or lost,
the reason kept for suppressed and failed only (campaigns.selectors.WITH_REASON, the counting rule of
campaign_counts). A statement touching no campaign row leaves after one check of its new rows. The
archiver's move (DELETE live, INSERT history) changes no count and fires neither. Statement-level,
not row-level: measured, a row-level trigger costs a campaign notification ~2× more (docs/PERFORMANCE.md).
Creating the triggers takes a brief SHARE ROW EXCLUSIVE lock on each table."""

import django.db.models.deletion
from django.db import migrations, models

LIVE, HISTORY, CHANGES = "notifications_notification", "notifications_notificationhistory", "campaigns_campaigntallychange"


def _key(row: str) -> str:
    return f"{row}.status, CASE WHEN {row}.status IN ('suppressed', 'failed') THEN {row}.reason ELSE '' END"


TRIGGERS = f"""
CREATE FUNCTION campaigns_tally_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM tally_new WHERE campaign_id IS NOT NULL) THEN RETURN NULL; END IF;
    INSERT INTO {CHANGES} (campaign_id, status, reason, n)
    SELECT n.campaign_id, {_key("n")}, count(*) FROM tally_new AS n WHERE n.campaign_id IS NOT NULL GROUP BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE FUNCTION campaigns_tally_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM tally_new WHERE campaign_id IS NOT NULL) THEN RETURN NULL; END IF;
    INSERT INTO {CHANGES} (campaign_id, status, reason, n)
    SELECT d.campaign_id, d.status, d.reason, sum(d.n) FROM (
        SELECT n.campaign_id, k.status, k.reason, k.n
          FROM tally_new AS n JOIN tally_old AS o ON o.id = n.id
         CROSS JOIN LATERAL (VALUES ({_key("n")}, 1), ({_key("o")}, -1)) AS k(status, reason, n)
         WHERE n.campaign_id IS NOT NULL AND ({_key("n")}) IS DISTINCT FROM ({_key("o")})) AS d
     GROUP BY 1, 2, 3;
    RETURN NULL;
END $$;

CREATE TRIGGER campaigns_tally_inserted AFTER INSERT ON {LIVE} REFERENCING NEW TABLE AS tally_new
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_tally_inserted();
CREATE TRIGGER campaigns_tally_updated AFTER UPDATE ON {LIVE} REFERENCING OLD TABLE AS tally_old NEW TABLE AS tally_new
    FOR EACH STATEMENT EXECUTE FUNCTION campaigns_tally_updated();
CREATE TRIGGER campaigns_tally_updated AFTER UPDATE ON {HISTORY} REFERENCING OLD TABLE AS tally_old
    NEW TABLE AS tally_new FOR EACH STATEMENT EXECUTE FUNCTION campaigns_tally_updated();
"""

DROP_TRIGGERS = f"""
DROP TRIGGER IF EXISTS campaigns_tally_inserted ON {LIVE};
DROP TRIGGER IF EXISTS campaigns_tally_updated ON {LIVE};
DROP TRIGGER IF EXISTS campaigns_tally_updated ON {HISTORY};
DROP FUNCTION IF EXISTS campaigns_tally_inserted();
DROP FUNCTION IF EXISTS campaigns_tally_updated();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0020_campaign_snapshot_kind'),
        ('notifications', '0049_campaign_pace_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='CampaignTally',
            fields=[
                ('campaign', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='tally', serialize=False, to='campaigns.campaign')),
                ('counts', models.JSONField(help_text='{"<status>": {"<reason>": n}}: the reason only for suppressed and failed.')),
                ('counted_at', models.DateTimeField(help_text='When the full count it started from was taken.')),
            ],
        ),
        migrations.CreateModel(
            name='CampaignTallyChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('campaign_id', models.UUIDField()),
                ('status', models.CharField(max_length=12)),
                ('reason', models.CharField(blank=True, max_length=32)),
                ('n', models.IntegerField()),
            ],
        ),
        migrations.AddField(
            model_name='campaignminute',
            name='last_due_at',
            field=models.DateTimeField(blank=True, help_text='When its last scheduled row is due (none scheduled: null).', null=True),
        ),
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
    ]

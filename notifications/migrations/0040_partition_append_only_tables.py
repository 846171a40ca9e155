"""The append-only tables become ``PARTITION BY RANGE`` on their time column, one partition per UTC
day plus a DEFAULT partition (core/partitions.py keeps them; docs/ARCHITECTURE.md §13): delivery
attempts and events on ``created_at``, the API audit log on ``at``.

Each table is renamed, a partitioned one with the same columns, CHECKs, defaults and indexes is made
under the old name (its primary key ``(id, <time column>)``: a partitioned table's unique keys must
hold the partition key; the model keeps ``id`` as its pk), a partition is created for every day the
old rows have, the rows are copied, the id sequence goes on from where it stood, and the old table
is dropped. The timeline view (0015) is dropped first and made again over the new tables.

Two rules change with it: the FKs to ``notifications_notification`` have no database constraint (a
row's notification may have moved to the history table), and a receipt's ``dedup_key`` can no longer
be a unique index (it would need the time column): receipts store it once under an advisory lock
(notifications/receipts.py, ``_lock_dedup_keys``); the index stays, not unique.
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models

from core import partitions

OLD_TIMELINE_SQL = importlib.import_module("notifications.migrations.0015_timeline_reads_attempts").VIEW_SQL

#: 0015's view, its lookups of an attempt's siblings bounded by the notification's ``created_at``
#: (``-infinity`` once the notification left the live table): they then read only the partitions
#: from its day on, as the caller's bound does for the view's own rows (``models.log_of``). ``OFFSET
#: 0`` keeps each NOT EXISTS a subplan run with the bound known (pruned at its start), not a join.
TIMELINE_SQL = """
CREATE VIEW notifications_timeline AS
SELECT e.id, e.notification_id, e.kind, e.status, e.reason, e.detail, e.created_at
  FROM notifications_deliveryevent AS e
UNION ALL
SELECT -a.id, a.notification_id, 'sent', 'sent', '',
       CASE a.outcome
         WHEN 'duplicate_skipped' THEN 'sent marker found: an earlier attempt was accepted'
         WHEN 'found_by_lookup' THEN 'found at ' || a.provider || ' (' || a.provider_message_id
                                     || '): the earlier call whose answer was lost had been accepted; not sent again'
         ELSE CASE WHEN a.device_id IS NULL THEN '' ELSE
           'accepted for ' || (SELECT count(DISTINCT d.device_id) FROM notifications_deliveryattempt AS d
                                WHERE d.notification_id = a.notification_id AND d.number = a.number
                                  AND d.outcome = 'accepted' AND d.created_at >= lo.since)
           || ' of ' || (SELECT count(DISTINCT d.device_id) FROM notifications_deliveryattempt AS d
                          WHERE d.notification_id = a.notification_id AND d.number = a.number
                            AND d.created_at >= lo.since)
           || ' device(s)' END
       END,
       a.created_at
  FROM notifications_deliveryattempt AS a
 CROSS JOIN LATERAL (SELECT COALESCE((SELECT n.created_at FROM notifications_notification AS n
                                       WHERE n.id = a.notification_id), '-infinity') AS since) AS lo
 WHERE a.outcome IN ('accepted', 'duplicate_skipped', 'found_by_lookup')
   AND NOT EXISTS (SELECT 1 FROM notifications_deliveryattempt AS b
                    WHERE b.notification_id = a.notification_id AND b.number = a.number
                      AND b.outcome = 'accepted' AND b.id < a.id AND b.created_at >= lo.since OFFSET 0)
   AND NOT EXISTS (SELECT 1 FROM notifications_deliveryevent AS s
                    WHERE s.notification_id = a.notification_id AND s.kind = 'sent' AND s.created_at >= lo.since
                   OFFSET 0)
"""

#: table → (time column, indexes made on the partitioned parent: name → definition).
TABLES = {
    "notifications_deliveryattempt": ("created_at", {
        "attempt_notification_idx": "(notification_id, created_at)",
        "notifications_deliveryattempt_device_id_604ca024": "(device_id)",
    }),
    "notifications_deliveryevent": ("created_at", {
        "event_notification_idx": "(notification_id, created_at)",
        "event_dedup_key_idx": "(dedup_key) WHERE dedup_key IS NOT NULL",
    }),
    "notifications_apiauditentry": ("at", {
        "audit_client_at_idx": "(client_id, at DESC)",
        "audit_at_idx": "(at DESC)",
    }),
}

#: FKs kept with a constraint (name, column, referenced table).
FOREIGN_KEYS = {
    "notifications_deliveryattempt": [("notifications_delive_device_id_604ca024_fk_preferenc", "device_id",
                                       "preferences_device")],
    "notifications_apiauditentry": [("notifications_apiaud_client_id_7449fcfb_fk_notificat", "client_id",
                                     "notifications_apiclient")],
}


def _partition(cur, table: str, column: str, indexes: dict[str, str]) -> None:
    old, seq = f"{table}_old", f"{table}_id_seq"
    cur.execute(f"ALTER TABLE {table} RENAME TO {old}")
    cur.execute(f"ALTER TABLE {old} RENAME CONSTRAINT {table}_pkey TO {old}_pkey")
    cur.execute(f"ALTER SEQUENCE {seq} RENAME TO {old}_id_seq")
    cur.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass AND NOT indisprimary",
                [old])
    for (index,) in cur.fetchall():
        cur.execute(f"DROP INDEX {index}")
    cur.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
                f"PRIMARY KEY (id, {column})) PARTITION BY RANGE ({column})")
    cur.execute(f"CREATE SEQUENCE {seq} AS bigint OWNED BY {table}.id")
    cur.execute(f"SELECT setval('{seq}', last_value, is_called) FROM {old}_id_seq")
    cur.execute(f"ALTER TABLE {table} ALTER COLUMN id SET DEFAULT nextval('{seq}')")
    for name, definition in indexes.items():
        cur.execute(f"CREATE INDEX {name} ON {table} {definition}")
    for name, col, target in FOREIGN_KEYS.get(table, []):
        cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({col}) REFERENCES {target} (id) "
                    "DEFERRABLE INITIALLY DEFERRED")
    cur.execute(f"CREATE TABLE {partitions.default_name(table)} PARTITION OF {table} DEFAULT")
    cur.execute(f"SELECT DISTINCT ({column} AT TIME ZONE 'UTC')::date FROM {old}")
    for (day,) in cur.fetchall():
        partitions.create_day(table, column, day)
    cur.execute(f"INSERT INTO {table} SELECT * FROM {old}")
    cur.execute(f"DROP TABLE {old}")


def forwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("DROP VIEW notifications_timeline")
        for table, (column, indexes) in TABLES.items():
            _partition(cur, table, column, indexes)
        cur.execute(TIMELINE_SQL)


#: The indexes 0039 had that the partitioned tables cannot (undone by :func:`backwards`; the foreign
#: keys to notifications lost their constraint in 0038, when rows began to move to the history).
PLAIN = {
    "notifications_deliveryattempt": [
        "CREATE INDEX attempt_notification_idx ON {t} (notification_id, created_at)",
        "CREATE INDEX notifications_deliveryattempt_device_id_604ca024 ON {t} (device_id)"],
    "notifications_deliveryevent": [
        "CREATE INDEX event_notification_idx ON {t} (notification_id, created_at)",
        "CREATE UNIQUE INDEX event_dedup_key_uniq ON {t} (dedup_key) WHERE dedup_key IS NOT NULL"],
    "notifications_apiauditentry": [
        "CREATE INDEX audit_client_at_idx ON {t} (client_id, at DESC)",
        "CREATE INDEX audit_at_idx ON {t} (at DESC)"],
}


def _unpartition(cur, table: str) -> None:
    old, seq = f"{table}_part", f"{table}_id_seq"
    cur.execute(f"ALTER TABLE {table} RENAME TO {old}")
    cur.execute(f"ALTER TABLE {old} RENAME CONSTRAINT {table}_pkey TO {old}_pkey")
    cur.execute(f"ALTER SEQUENCE {seq} RENAME TO {old}_id_seq")
    for name, _index in TABLES[table][1].items():
        cur.execute(f"DROP INDEX {name}")
    cur.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING CONSTRAINTS)")
    cur.execute(f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY, ADD PRIMARY KEY (id)")
    cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), last_value, is_called) FROM {old}_id_seq")
    for statement in PLAIN[table]:
        cur.execute(statement.format(t=table))
    for name, col, target in FOREIGN_KEYS.get(table, []):
        cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({col}) REFERENCES {target} (id) "
                    "DEFERRABLE INITIALLY DEFERRED")
    cur.execute(f"INSERT INTO {table} SELECT * FROM {old}")
    cur.execute(f"DROP TABLE {old}")


def backwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        cur.execute("DROP VIEW notifications_timeline")
        for table in TABLES:
            _unpartition(cur, table)
        cur.execute(OLD_TIMELINE_SQL)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0039_notification_finished_index'),
        ('preferences', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveConstraint(model_name='deliveryevent', name='event_dedup_key_uniq'),
                migrations.AddIndex(
                    model_name='deliveryevent',
                    index=models.Index(condition=models.Q(dedup_key__isnull=False), fields=['dedup_key'],
                                       name='event_dedup_key_idx')),
            ],
        ),
    ]

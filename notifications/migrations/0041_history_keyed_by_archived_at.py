"""The history is partitioned by ``archived_at`` (when the archiver moved the row), no longer by
``created_at`` (issue 25): a row scheduled weeks ahead was archived into a creation day long
dropped (DEFAULT, deleted as a stray) and its late receipts were not found. Retention now counts
from archival; docs/ARCHITECTURE.md §13.

The history is rebuilt: the old table (and its partitions) renamed, a new one made under the name
with the live columns plus ``archived_at timestamptz NOT NULL``, its primary key ``(id, <key>)``,
the same indexes, a DEFAULT partition and a partition for every day the copied rows fall on and,
when there are any, today (an empty database gets today's from the first ``maintain()``); the rows copied (``archived_at`` = the old row's ``updated_at``: its last change before it
moved, the best we know), the old table dropped, the view made again. Backwards the same, by
``created_at`` and without the column."""

from django.db import migrations, models

from core import clock, partitions
from notifications.migrations._history_sql import HISTORY, INDEXES, LIVE, RECREATE_VIEW, VIEW, live_columns, recreate_view

OLD = f"{HISTORY}_old"


def _rebuild(cur, key: str) -> None:
    """Make the history again partitioned by ``key`` (``archived_at``: with the column; ``created_at``:
    without it), rows and all."""
    cur.execute(f"DROP VIEW IF EXISTS {VIEW}")
    cur.execute(f"ALTER TABLE {HISTORY} RENAME TO {OLD}")
    cur.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT {HISTORY}_pkey TO {OLD}_pkey")
    cur.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = %s::regclass", [OLD])
    for (child,) in cur.fetchall():
        cur.execute(f"ALTER TABLE {child} RENAME TO {OLD}{child[len(HISTORY):]}")
    for name in INDEXES:
        cur.execute(f"DROP INDEX IF EXISTS {name}")
    extra = ", archived_at timestamptz NOT NULL" if key == "archived_at" else ""
    cur.execute(f"CREATE TABLE {HISTORY} (LIKE {LIVE} INCLUDING DEFAULTS{extra}) PARTITION BY RANGE ({key})")
    cur.execute(f"ALTER TABLE {HISTORY} ADD CONSTRAINT {HISTORY}_pkey PRIMARY KEY (id, {key})")
    for name, spec in INDEXES.items():
        cur.execute(f"CREATE INDEX {name} ON {HISTORY} {spec}")
    cur.execute(f"CREATE TABLE {partitions.default_name(HISTORY)} PARTITION OF {HISTORY} DEFAULT")
    source = "updated_at" if key == "archived_at" else key
    cur.execute(f"SELECT DISTINCT ({source} AT TIME ZONE 'UTC')::date FROM {OLD}")
    days = {r[0] for r in cur.fetchall()}
    if days:  # a database in use: the archiver writes today's next (an empty one gets it from maintain())
        days.add(clock.now().date())
    for day in sorted(days):
        partitions.create_day(HISTORY, key, day)
    cols = ", ".join(f'"{c}"' for c in live_columns(cur))
    into, values = (f"{cols}, archived_at", f"{cols}, updated_at") if key == "archived_at" else (cols, cols)
    cur.execute(f"INSERT INTO {HISTORY} ({into}) SELECT {values} FROM {OLD}")
    cur.execute(f"DROP TABLE {OLD}")
    if key == "archived_at":
        recreate_view(cur)
    else:
        cur.execute(RECREATE_VIEW)


def forwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        _rebuild(cur, "archived_at")


def backwards(apps, schema_editor):
    with schema_editor.connection.cursor() as cur:
        _rebuild(cur, "created_at")


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0040_partition_append_only_tables'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.AddField(
                    model_name='notificationhistory', name='archived_at',
                    field=models.DateTimeField(help_text='When the archiver moved it here (the partition key).')),
                migrations.AddField(
                    model_name='notificationrecord', name='archived_at',
                    field=models.DateTimeField(blank=True, null=True,
                                               help_text='When it was archived to the history; null while live.')),
            ],
        ),
    ]

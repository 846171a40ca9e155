"""The notification history's DDL, shared by the migrations that create or change it: the history
has the live table's columns plus ``archived_at`` (its partition key since 0041), and the view reads
both. The archiver names the columns it moves (``notifications.lifecycle.archive``). A migration that
adds a column to ``notifications_notification`` adds it to the history too and calls
:func:`recreate_view` (``tests/test_history_schema.py`` fails until it does). Design:
docs/ARCHITECTURE.md, "Where a row lives"."""

LIVE = "notifications_notification"
HISTORY = "notifications_notificationhistory"
VIEW = "notifications_notificationrecord"

#: The history's indexes beside its primary key (0037; 0041 made them again on the rebuilt table).
INDEXES = {
    "notification_history_recipient_idx": "(recipient_id, created_at DESC)",
    "notification_history_pmid_idx": "(provider_message_id) WHERE provider_message_id <> ''",
    "notification_history_campaign_idx": "(campaign_id) WHERE campaign_id IS NOT NULL",
    "notification_history_event_idx": "(event_id) WHERE event_id IS NOT NULL",
    "notification_history_created_idx": "(created_at DESC)",
    "notification_history_status_time_idx": "(status, created_at DESC)",
}

#: 0037's history, partitioned by day of ``created_at`` (0041 re-keys it on ``archived_at``).
CREATE_HISTORY = f"""
CREATE TABLE {HISTORY} (LIKE {LIVE} INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
ALTER TABLE {HISTORY} ADD CONSTRAINT {HISTORY}_pkey PRIMARY KEY (id, created_at);
CREATE TABLE {HISTORY}_default PARTITION OF {HISTORY} DEFAULT;
""" + "".join(f"CREATE INDEX {name} ON {HISTORY} {spec};\n" for name, spec in INDEXES.items())

#: 0037's view (the history had exactly the live table's columns then).
RECREATE_VIEW = f"""
DROP VIEW IF EXISTS {VIEW};
CREATE VIEW {VIEW} AS
    SELECT live.*, true AS live FROM {LIVE} AS live
    UNION ALL
    SELECT history.*, false AS live FROM {HISTORY} AS history;
"""

DROP = f"DROP VIEW IF EXISTS {VIEW}; DROP TABLE IF EXISTS {HISTORY};"


def live_columns(cur) -> list[str]:
    """The live table's columns, in order, as the database has them now."""
    cur.execute("""SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0
                      AND NOT attisdropped ORDER BY attnum""", [LIVE])
    return [r[0] for r in cur.fetchall()]


def recreate_view(cur) -> None:
    """The view of live + history: the live columns (in the live table's order), ``archived_at``
    (NULL for a live row) and ``live``."""
    cols = ", ".join(f'"{c}"' for c in live_columns(cur))
    cur.execute(f"""DROP VIEW IF EXISTS {VIEW};
CREATE VIEW {VIEW} AS
    SELECT {cols}, NULL::timestamptz AS archived_at, true AS live FROM {LIVE}
    UNION ALL
    SELECT {cols}, archived_at, false AS live FROM {HISTORY}""")

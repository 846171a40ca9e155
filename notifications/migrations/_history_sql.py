"""The notification history's DDL, shared by the migrations that create or change it: the history
has the live table's columns in the live table's order (the archiver moves rows with
``INSERT … SELECT *``), and the view reads both. A migration that adds a column to
``notifications_notification`` adds it to the history too and calls :data:`RECREATE_VIEW`
(``tests/test_history_schema.py`` fails until it does). Design: docs/ARCHITECTURE.md, "Where a row lives"."""

LIVE = "notifications_notification"
HISTORY = "notifications_notificationhistory"
VIEW = "notifications_notificationrecord"

CREATE_HISTORY = f"""
CREATE TABLE {HISTORY} (LIKE {LIVE} INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
ALTER TABLE {HISTORY} ADD CONSTRAINT {HISTORY}_pkey PRIMARY KEY (id, created_at);
CREATE TABLE {HISTORY}_default PARTITION OF {HISTORY} DEFAULT;
CREATE INDEX notification_history_recipient_idx ON {HISTORY} (recipient_id, created_at DESC);
CREATE INDEX notification_history_pmid_idx ON {HISTORY} (provider_message_id) WHERE provider_message_id <> '';
CREATE INDEX notification_history_campaign_idx ON {HISTORY} (campaign_id) WHERE campaign_id IS NOT NULL;
CREATE INDEX notification_history_event_idx ON {HISTORY} (event_id) WHERE event_id IS NOT NULL;
CREATE INDEX notification_history_created_idx ON {HISTORY} (created_at DESC);
CREATE INDEX notification_history_status_time_idx ON {HISTORY} (status, created_at DESC);
"""

RECREATE_VIEW = f"""
DROP VIEW IF EXISTS {VIEW};
CREATE VIEW {VIEW} AS
    SELECT live.*, true AS live FROM {LIVE} AS live
    UNION ALL
    SELECT history.*, false AS live FROM {HISTORY} AS history;
"""

DROP = f"DROP VIEW IF EXISTS {VIEW}; DROP TABLE IF EXISTS {HISTORY};"

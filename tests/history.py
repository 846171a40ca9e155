"""Move notifications to the history in a test, as the archiver does (one statement: delete from the
live table, insert what it returned; docs/ARCHITECTURE.md, "Where a row lives")."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from core import clock
from notifications.lifecycle.archive import into_history
from notifications.migrations._history_sql import LIVE


def archive(*ids, at: datetime | None = None) -> int:
    """Move the live rows ``ids`` to the history, archived ``at`` (default: the test clock's now);
    returns how many moved. A foreign key still pointing
    at the live table (the delivery log's, before it was partitioned) is dropped inside the test's
    transaction (rolled back with it), as on a database where the archiver runs."""
    with connection.cursor() as cur:
        cur.execute("SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE confrelid = %s::regclass",
                    [LIVE])
        found = cur.fetchall()
        if found:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # checks the pending ones: ALTER refuses to wait on them
            for table, name in found:
                cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            cur.execute("SET CONSTRAINTS ALL DEFERRED")
        cur.execute(f"""WITH moved AS (DELETE FROM {LIVE} WHERE id = ANY(%(ids)s::uuid[]) RETURNING *)
                        {into_history("moved")}""",
                    {"ids": [str(i) for i in ids], "archived_at": at or clock.now()})
        return cur.rowcount

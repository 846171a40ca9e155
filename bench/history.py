"""A bench database that has lived: ``manage.py bench --history-days D --history-per-day N``
(docs/PERFORMANCE.md, "A bench that has lived").

Before the run, D days × N notifications a day are COPYed in, spread over the D days before the
platform clock's now, mixed as production makes them (campaign, single and typed sends; statuses,
reasons and dead letters per channel; attempt rows, timeline events, provider receipts, API audit
rows) over a pool of reused recipients. Rows finished more than ``NOTIFY["HOT_HOURS"]`` ago go to
``notifications_notificationhistory`` when that table exists, all others to the live table; the day
partitions are made before the COPY. After it, ``VACUUM (ANALYZE)`` of the filled tables (a production
database is vacuumed in steady state: autovacuum must not run during the measured run), timed apart
(``vacuum_seconds``, included in ``fill_seconds``). The fill
is recorded in ``bench_history_fill``: the same request later reuses it, and the reset before each
run (:func:`reset_run_rows`) then deletes only the rows made after the fill's instant.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction

from bench.history_rows import HISTORY_TABLE, SEGMENT, Filler, recipients_for, table_exists
from campaigns.models import Campaign, Segment
from core import clock
from notifications.events.models import Event
from notifications.models import APIAuditEntry, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Device, Recipient

__all__ = ["FILLED", "HISTORY_TABLE", "LIVE_TABLE", "RECORD_TABLE", "SEGMENT", "Filler", "ensure_history",
           "recorded", "reset_run_rows", "sizes", "table_exists", "wipe"]

log = logging.getLogger(__name__)

RECORD_TABLE = "bench_history_fill"
LIVE_TABLE = Notification._meta.db_table
#: Tables the fill writes, with the column that says when a row was made: the reset deletes the
#: rows at or after the fill's instant from these and truncates every other table it empties.
FILLED = {LIVE_TABLE: "created_at", HISTORY_TABLE: "archived_at", DeliveryAttempt._meta.db_table: "created_at",
          DeliveryEvent._meta.db_table: "created_at", Event._meta.db_table: "created_at",
          Campaign._meta.db_table: "created_at", APIAuditEntry._meta.db_table: "at"}


#: A notification's own rows (the reset empties them with it, with or without a foreign key).
NOTIFICATION_ROWS = (DeliveryAttempt._meta.db_table, DeliveryEvent._meta.db_table)


# --- the record --------------------------------------------------------------------------------
def recorded() -> dict | None:
    """The fill the bench database holds (days, per_day, filled_at, rows, seconds), or None."""
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", [RECORD_TABLE])
        if not cur.fetchone()[0]:
            return None
        cur.execute(f"SELECT days, per_day, filled_at, rows, seconds, to_jsonb(f) -> 'vacuum_seconds' "
                    f"FROM {RECORD_TABLE} AS f")  # an older record has no vacuum_seconds
        row = cur.fetchone()
    if row is None:
        return None
    rows = row[3] if isinstance(row[3], dict) else json.loads(row[3])
    return {"days": row[0], "per_day": row[1], "filled_at": row[2], "rows": rows, "seconds": row[4],
            "vacuum_seconds": float(row[5] or 0)}


def _write_record(days: int, per_day: int, filled_at: datetime, rows: dict, seconds: float,
                  vacuum_seconds: float) -> None:
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {RECORD_TABLE} (days int NOT NULL, per_day int NOT NULL, "
                    "filled_at timestamptz NOT NULL, rows jsonb NOT NULL, seconds double precision NOT NULL, "
                    "vacuum_seconds double precision NOT NULL DEFAULT 0)")
        cur.execute(f"DELETE FROM {RECORD_TABLE}")
        cur.execute(f"INSERT INTO {RECORD_TABLE} VALUES (%s, %s, %s, %s, %s, %s)",
                    [days, per_day, filled_at, json.dumps(rows), seconds, vacuum_seconds])


# --- reset -------------------------------------------------------------------------------------
def _closure(roots: tuple[str, ...]) -> list[str]:
    """``roots`` and every table referencing them by a foreign key, transitively (what ``TRUNCATE …
    CASCADE`` empties), children before the tables they reference."""
    with connection.cursor() as cur:
        cur.execute("SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint "
                    "WHERE contype = 'f' AND conrelid <> confrelid")
        referencing: dict[str, set[str]] = {}
        for child, parent in cur.fetchall():
            referencing.setdefault(parent, set()).add(child)
    order: list[str] = []

    def visit(table: str, path: tuple[str, ...]) -> None:
        if table in order or table in path:
            return
        for child in sorted(referencing.get(table, ())):
            visit(child, (*path, table))
        order.append(table)

    for root in roots:
        visit(root, ())
    return order


def reset_run_rows(tables: tuple[str, ...]) -> dict[str, int]:
    """Empty ``tables`` (and what references them) of what earlier bench runs made, keeping the fill.

    Without a fill: ``TRUNCATE … CASCADE``, as the bench always did. With one: the tables the fill
    writes (:data:`FILLED`) lose their rows made at or after the fill's instant (every fill row is
    older; a run's rows are newer), one DELETE each, children first, then VACUUM ANALYZE where rows
    went; the other tables of the closure (shards, inbox and digest items) are truncated. Returns the
    rows deleted per table (every filled table, the API audit log included).
    """
    record = recorded()
    if record is None:
        # Attempts and events by name too: partitioned, they lose their foreign key (issue 25's design).
        own = [t for t in (HISTORY_TABLE, *NOTIFICATION_ROWS) if table_exists(t)]
        with connection.cursor() as cur:
            cur.execute(f"TRUNCATE {', '.join([*tables, *own])} CASCADE")
        return {}
    since = record["filled_at"]
    closure = _closure(tables)
    # Filled tables no foreign key ties to ``tables`` (the history, the audit log; attempts and
    # events once partitioned) reference nothing a DELETE below removes: first is safe.
    closure = [t for t in FILLED if t not in closure and table_exists(t)] + closure
    others = [t for t in closure if t not in FILLED]
    deleted: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cur:
        if others:
            cur.execute(f"TRUNCATE {', '.join(others)}")
        for table in closure:
            if table in FILLED:
                cur.execute(f"DELETE FROM {table} WHERE {FILLED[table]} >= %s", [since])
                deleted[table] = cur.rowcount
    with connection.cursor() as cur:
        for table, count in deleted.items():
            if count:
                cur.execute(f"VACUUM ANALYZE {table}")
    return deleted


def wipe(tables: tuple[str, ...]) -> None:
    """Remove the fill and its record: the bench database empty again, as a run without history wants."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {RECORD_TABLE}")
        # Attempts and events by name too: partitioned, no foreign key cascades the TRUNCATE to them.
        own = [t for t in (HISTORY_TABLE, *NOTIFICATION_ROWS) if table_exists(t)]
        cur.execute(f"TRUNCATE {', '.join([*tables, *own])} CASCADE")
        cur.execute(f"TRUNCATE {APIAuditEntry._meta.db_table}")
        cur.execute(f"DELETE FROM {Segment._meta.db_table} WHERE segment_id = %s", [SEGMENT])


# --- report ------------------------------------------------------------------------------------
def sizes(tables) -> dict[str, dict[str, int]]:
    """Table and index bytes of each table (a partitioned one: summed over its partitions)."""
    out = {}
    with connection.cursor() as cur:
        for table in tables:
            if not table_exists(table):
                continue
            # pg_partition_tree lists a partitioned table's partitions (and itself); a plain table: none.
            cur.execute("SELECT sum(pg_table_size(r)), sum(pg_indexes_size(r)) FROM (SELECT relid AS r FROM "
                        "pg_partition_tree(%s::regclass) UNION SELECT %s::regclass) AS t", [table, table])
            table_bytes, index_bytes = cur.fetchone()
            out[table] = {"table_bytes": int(table_bytes), "index_bytes": int(index_bytes)}
    return out


def report(record: dict, reused: bool) -> dict:
    """The JSON's ``history``: the request, what the fill wrote, its seconds, and the tables' sizes now."""
    return {"days": record["days"], "per_day": record["per_day"],
            "filled_at": record["filled_at"].isoformat(timespec="seconds"), "reused": reused,
            "fill_seconds": round(record["seconds"], 1), "vacuum_seconds": round(record["vacuum_seconds"], 1),
            "rows": record["rows"],
            "recipients": recipients_for(record["days"] * record["per_day"]),
            "bytes": sizes(record["rows"])}


# --- the fill ----------------------------------------------------------------------------------
def ensure_history(days: int, per_day: int, tables: tuple[str, ...],
                   progress: Callable[[str], None] = log.info) -> dict:
    """The history of ``days`` × ``per_day`` in the bench database: reused when the record says it
    was filled for the same request, else (after removing any other fill) filled now. Returns
    :func:`report`."""
    record = recorded()
    if record and (record["days"], record["per_day"]) == (days, per_day):
        progress(f"history: reusing the fill of {record['filled_at']:%Y-%m-%d %H:%M} ({days} days × {per_day:,})")
        return report(record, reused=True)
    if record:
        progress(f"history: removing the fill of {record['days']} days × {record['per_day']:,}")
    wipe(tables)
    started = time.perf_counter()
    now = clock.now()
    progress(f"history: filling {days} days × {per_day:,} notifications/day by COPY…")
    rows = Filler(days, per_day, now, progress).fill()
    maintained = _maintain_partitions()
    vacuum_started = time.perf_counter()
    with connection.cursor() as cur:  # steady state: vacuumed, so autovacuum does not run during the run
        for table in [*rows, Recipient._meta.db_table, Device._meta.db_table]:
            cur.execute(f"VACUUM (ANALYZE) {table}")
    vacuum_seconds = time.perf_counter() - vacuum_started
    seconds = time.perf_counter() - started
    _write_record(days, per_day, now, rows, seconds, vacuum_seconds)
    progress(f"history: filled {sum(rows.values()):,} rows in {seconds:.0f} s, of which VACUUM (ANALYZE) "
             f"{vacuum_seconds:.0f} s ({maintained})")
    return report({"days": days, "per_day": per_day, "filled_at": now, "rows": rows, "seconds": seconds,
                   "vacuum_seconds": vacuum_seconds}, reused=False)


def _maintain_partitions() -> str:
    """Run ``core.partitions.maintain()`` when the partition manager exists (issue 25 builds it), so
    the fill's rows leave the DEFAULT partitions for their days. Returns what happened, for the log."""
    try:
        partitions = importlib.import_module("core.partitions")
    except ImportError:
        return "no partition manager"
    maintain = getattr(partitions, "maintain", None)
    if maintain is None:
        return "no core.partitions.maintain"
    try:
        maintain()
    except Exception as exc:  # the rows stay in the DEFAULT partitions: still a valid history
        log.warning("partition maintenance after the fill failed: %s", exc)
        return f"partition maintenance failed: {exc}"
    return "partitions maintained"

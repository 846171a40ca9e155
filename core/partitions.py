"""Daily RANGE partitions of the append-only tables and the notification history, and their retention
(docs/ARCHITECTURE.md §13). Each table's key column is read from the catalog (:func:`key_column`): the
history's is ``archived_at``, the others' their creation time.

For every table of ``settings.NOTIFY["RETENTION_DAYS"]`` (table → days) :func:`maintain` creates a
partition ``<table>_pYYYYMMDD`` for each UTC day from the platform clock's today to
``PARTITIONS_AHEAD_DAYS`` ahead, moves rows that landed in ``<table>_default`` into their own day's
partition (past days within the retention only), and detaches and drops whole partitions whose day
is older than the retention: never a DELETE of rows outside the DEFAULT partition. Ours rather than
django-postgres-extra, which needs its own database backend and model base class and cannot move
stray rows out of a DEFAULT partition (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from core import clock

log = logging.getLogger(__name__)

#: The advisory lock one maintenance run holds (session level): a second run meanwhile skips.
LOCK_KEY = 0x6E6F7469_70617274 & 0x7FFFFFFFFFFFFFFF  # "notipart"

#: Redis hash of the last run: ``at``, ``outcome`` (ok, skipped, error: …), ``success_at`` (epoch s).
LAST_RUN_KEY = "notify:partitions:last_run"

#: A maintenance step waits at most this long for a table lock, so it never stalls the send path.
LOCK_TIMEOUT = "5s"

_DAY_SUFFIX = re.compile(r"_p(\d{8})$")
#: A registered table's name: its partitions add ``_pYYYYMMDD`` within Postgres' 63 characters.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class NotPartitioned(Exception):
    """A table in the retention registry is not a RANGE-partitioned table."""

    def __init__(self, table: str) -> None:
        super().__init__(f"NOTIFY['RETENTION_DAYS'] names {table!r}, which is not a table partitioned by RANGE")
        self.table = table


@dataclass(frozen=True)
class TableRun:
    """What one run did to one table: partitions created (with the rows moved in from DEFAULT),
    partitions dropped, and expired rows deleted from DEFAULT."""

    table: str
    created: tuple[str, ...] = ()
    moved: dict[str, int] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    expired_in_default: int = 0


@dataclass(frozen=True)
class MaintenanceRun:
    """What :func:`maintain` did; ``skipped`` when another run held the lock."""

    at: datetime
    tables: tuple[TableRun, ...] = ()
    skipped: bool = False


@dataclass(frozen=True)
class TableState:
    """A table's partitions as the health page and /metrics show them."""

    table: str
    retention_days: int
    partitions: int
    oldest_day: date | None
    default_rows: int


def registry() -> dict[str, int]:
    """``settings.NOTIFY["RETENTION_DAYS"]``: table → days kept."""
    return dict(settings.NOTIFY["RETENTION_DAYS"])


def setting_problems() -> list[str]:
    """What is wrong with ``NOTIFY["RETENTION_DAYS"]`` and ``NOTIFY["PARTITIONS_AHEAD_DAYS"]``, each
    naming the setting and the rule (``manage.py check``, notifications.E002): a retention of 0 would
    drop today's partition, a table name that is not an identifier cannot be a partition's stem."""
    problems = []
    for table, keep in registry().items():
        if not _IDENTIFIER.fullmatch(str(table)):
            problems.append(f'NOTIFY["RETENTION_DAYS"] key {table!r} must be a table name (lower-case letters, '
                            "digits, underscores; at most 40 characters)")
        if not isinstance(keep, int) or keep < 1:
            problems.append(f'NOTIFY["RETENTION_DAYS"]["{table}"] must be a whole number of days >= 1, got {keep!r}')
    ahead = settings.NOTIFY.get("PARTITIONS_AHEAD_DAYS")
    if not isinstance(ahead, int) or ahead < 1:
        problems.append(f"PARTITIONS_AHEAD_DAYS must be a whole number of days >= 1, got {ahead!r}")
    return problems


def partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def _start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def key_column(table: str) -> str:
    """The column ``table`` is partitioned on; raises :class:`NotPartitioned` otherwise."""
    with connection.cursor() as cur:
        cur.execute("""SELECT a.attname FROM pg_partitioned_table p
                         JOIN pg_class c ON c.oid = p.partrelid
                         JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
                        WHERE c.relname = %s AND c.relnamespace = 'public'::regnamespace
                          AND p.partstrat = 'r' AND p.partnatts = 1""", [table])
        row = cur.fetchone()
    if row is None:
        raise NotPartitioned(table)
    return row[0]


def days(table: str) -> list[date]:
    """The days that have a partition of ours (named ``<table>_pYYYYMMDD``), oldest first."""
    with connection.cursor() as cur:
        cur.execute("""SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                        WHERE i.inhparent = %s::regclass""", [table])
        names = [r[0] for r in cur.fetchall()]
    found = (_DAY_SUFFIX.search(n) for n in names if n.startswith(f"{table}_p"))
    return sorted(datetime.strptime(m.group(1), "%Y%m%d").date() for m in found if m)


def _default_days(table: str, column: str, since: date, before: date) -> list[date]:
    """Days in ``[since, before)`` that have rows in ``table``'s DEFAULT partition."""
    with connection.cursor() as cur:
        cur.execute(f"""SELECT DISTINCT (({column}) AT TIME ZONE 'UTC')::date FROM {default_name(table)}
                         WHERE {column} >= %s AND {column} < %s""", [_start(since), _start(before)])
        return sorted(r[0] for r in cur.fetchall())


def create_day(table: str, column: str, day: date) -> int:
    """Make ``day``'s partition in one transaction, moving its rows out of DEFAULT first (ATTACH
    refuses a range DEFAULT still holds rows of); returns how many rows moved."""
    name, dflt = partition_name(table, day), default_name(table)
    lo, hi = _start(day), _start(day + timedelta(days=1))
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute(f"SELECT 1 FROM {dflt} WHERE {column} >= %s AND {column} < %s LIMIT 1", [lo, hi])
        if cur.fetchone() is None:
            cur.execute(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM (%s) TO (%s)", [lo, hi])
            return 0
        cur.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        cur.execute(f"INSERT INTO {name} SELECT * FROM {dflt} WHERE {column} >= %s AND {column} < %s", [lo, hi])
        moved = cur.rowcount
        cur.execute(f"DELETE FROM {dflt} WHERE {column} >= %s AND {column} < %s", [lo, hi])
        # The CHECK lets ATTACH skip scanning the new partition; dropped once attached.
        cur.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_range "
                    f"CHECK ({column} IS NOT NULL AND {column} >= %s AND {column} < %s)", [lo, hi])
        cur.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)", [lo, hi])
        cur.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")
    return moved


def _drop_day(table: str, day: date) -> None:
    name = partition_name(table, day)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute(f"ALTER TABLE {table} DETACH PARTITION {name}")
        cur.execute(f"DROP TABLE {name}")


def _maintain_table(table: str, keep_days: int, now: datetime) -> TableRun:
    column = key_column(table)
    today = now.astimezone(UTC).date()
    horizon = now - timedelta(days=keep_days)  # a day ending at or before this is past its retention
    first_kept = horizon.astimezone(UTC).date()  # the oldest day with any row still kept
    have = set(days(table))
    created: list[str] = []
    moved: dict[str, int] = {}
    wanted = [today + timedelta(days=n) for n in range(settings.NOTIFY["PARTITIONS_AHEAD_DAYS"] + 1)]
    wanted += _default_days(table, column, first_kept, today)
    for day in sorted(set(wanted) - have):
        count = create_day(table, column, day)
        created.append(partition_name(table, day))
        if count:
            moved[partition_name(table, day)] = count
    dropped = []
    for day in sorted(have):
        if _start(day + timedelta(days=1)) <= horizon:
            _drop_day(table, day)
            dropped.append(partition_name(table, day))
    with transaction.atomic(), connection.cursor() as cur:  # strays in DEFAULT past the retention
        cur.execute(f"DELETE FROM {default_name(table)} WHERE {column} < %s", [_start(first_kept)])
        expired = cur.rowcount
    return TableRun(table, tuple(created), moved, tuple(dropped), expired)


def maintain(now: datetime | None = None) -> MaintenanceRun:
    """One maintenance run over every table of the registry (module docstring), under a session
    advisory lock: a run that finds another one holding it does nothing (``skipped``). Every table
    is checked first, so a registry naming a table that is not partitioned changes nothing and raises
    :class:`NotPartitioned`. The outcome is kept for the health page and /metrics (:func:`last_run`)."""
    now = now or clock.now()
    tables = registry()
    try:
        for table in tables:
            key_column(table)
    except NotPartitioned as exc:
        _remember(now, f"error: NotPartitioned: {exc}"[:300])
        raise
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY])
        if not cur.fetchone()[0]:
            _remember(now, "skipped")
            return MaintenanceRun(now, skipped=True)
    try:
        done = tuple(_maintain_table(table, keep, now) for table, keep in tables.items())
    except Exception as exc:
        _remember(now, f"error: {type(exc).__name__}: {exc}"[:300])
        raise
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
    _remember(now, "ok")
    return MaintenanceRun(now, done)


def _remember(now: datetime, outcome: str) -> None:
    """Keep the last run's instant and outcome in Redis (a lost record only empties the page's cell)."""
    from core.redis_client import get_redis

    fields: dict[Any, Any] = {"at": now.timestamp(), "outcome": outcome}
    if outcome == "ok":
        fields["success_at"] = now.timestamp()
    try:
        get_redis().hset(LAST_RUN_KEY, mapping=fields)
    except Exception as exc:  # redis raises many types; the run itself is done
        log.warning("partition maintenance: last run not recorded (%s)", exc)


def last_run() -> dict:
    """The last run as kept by :func:`maintain`: ``at``, ``outcome``, ``success_at`` (each may be absent),
    and ``alert_success_at``: ``success_at``, or when none is recorded the instant a reader first found
    it missing (notifications/housekeeping.py's rule: a Redis flush does not page at once)."""
    import time as clock_time

    from core.redis_client import first_found_missing, get_redis

    client = get_redis()
    raw = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
           for k, v in client.hgetall(LAST_RUN_KEY).items()}
    success = datetime.fromtimestamp(float(raw["success_at"]), UTC) if "success_at" in raw else None
    watched = success or datetime.fromtimestamp(
        first_found_missing(client, LAST_RUN_KEY, "success_at", clock_time.time()), UTC)
    return {"at": datetime.fromtimestamp(float(raw["at"]), UTC) if "at" in raw else None,
            "outcome": raw.get("outcome"), "success_at": success, "alert_success_at": watched}


#: A last success older than this many maintenance intervals is stale (the health page, the alert).
STALE_INTERVALS = 2


def stale_after() -> timedelta:
    """How old the last successful run may be: :data:`STALE_INTERVALS` × beat's interval
    (``PARTITION_MAINTENANCE_SECONDS``), so one missed or failed run is not yet stale, two are."""
    return STALE_INTERVALS * timedelta(seconds=settings.CELERY_BEAT_SCHEDULE["maintain-partitions"]["schedule"])


def is_stale(success_at: datetime | None, now: datetime | None = None) -> bool:
    """Whether maintenance has not succeeded within :func:`stale_after` (or never recorded a success):
    the days ahead run out after ``PARTITIONS_AHEAD_DAYS`` and rows then land in DEFAULT."""
    return success_at is None or success_at < (now or clock.now()) - stale_after()


def states() -> list[TableState]:
    """Each registered table's retention, number of day partitions, oldest day and rows in DEFAULT
    (counted up to 10,000: DEFAULT should be nearly empty)."""
    out = []
    for table, keep in registry().items():
        key_column(table)
        held = days(table)
        with connection.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {default_name(table)} LIMIT 10000) AS d")
            stray = cur.fetchone()[0]
        out.append(TableState(table, keep, len(held), held[0] if held else None, stray))
    return out

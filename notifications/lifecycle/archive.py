"""Live → history: the archiver, and where the lifecycle finds a row that moved (docs/ARCHITECTURE.md,
"Where a row lives").

:func:`archive` moves finished rows (:data:`~notifications.lifecycle.table.FINISHED`) whose last
change is older than ``NOTIFY["HOT_HOURS"]`` from ``notifications_notification`` to the partitioned
``notifications_notificationhistory`` stamped ``archived_at`` (the run's instant, the history's
partition key: retention counts from it), one statement per batch (``DELETE … RETURNING`` into
``INSERT``, candidates locked ``SKIP LOCKED``: a row a worker or a receipt holds stays for the next
run). It keeps live: a dead letter not replayed (until ``DEAD_LETTER_DAYS``), a row a fallback
channel still waits behind, a fallback channel whose predecessor is still live (that one's bounce
may reopen it), and whatever an app above registers with :func:`register_hold` (campaigns: a row of
a campaign still fanning out, whose pages insert by id). :func:`archived` reads moved rows back as
:class:`~notifications.models.ArchivedNotification` for the writes that must reach them, and
:func:`in_history` is the one place that addresses a history row by its key.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet

from notifications.lifecycle.table import FINISHED
from notifications.models import ArchivedNotification, Notification, NotificationHistory

LIVE, HISTORY = Notification._meta.db_table, NotificationHistory._meta.db_table

#: SQL conditions on a candidate ``n`` that keep it live, registered by apps above this one.
_HOLDS: dict[str, str] = {}

#: A provider's receipt comes at most this long after the send; a row is archived after it was sent,
#: so its history row has ``archived_at >= receipt - RECEIPT_WINDOW``. A later receipt is unknown.
RECEIPT_WINDOW = timedelta(hours=72)

#: The columns a move copies (the live table's, by name: the history's order may differ).
_COLUMNS = ", ".join(f'"{f.column}"' for f in Notification._meta.concrete_fields)


def into_history(source: str, archived_at: str = "%(archived_at)s") -> str:
    """SQL inserting the rows of ``source`` (a CTE of moved live rows) into the history, stamped
    ``archived_at`` (an SQL expression; the archiver's: its run's instant): the archiver's move, and
    the tests' (tests/history.py)."""
    return f"INSERT INTO {HISTORY} ({_COLUMNS}, archived_at) SELECT {_COLUMNS}, {archived_at} FROM {source}"


def in_history(pk, archived_at: datetime):
    """The history row ``pk`` archived at ``archived_at``: its full key, so one partition is read."""
    return NotificationHistory.objects.filter(pk=pk, archived_at=archived_at)


def register_hold(name: str, condition: str) -> None:
    """Keep a candidate row ``n`` live while the SQL ``condition`` on it holds (an app above this one,
    at start-up: the arrow points down). ``name`` makes a second registration replace the first."""
    _HOLDS[name] = condition


def _keep_for_fallback() -> str:
    return f"""
   AND (n.fallback_after IS NULL OR NOT EXISTS (SELECT 1 FROM {LIVE} AS p WHERE p.id = n.fallback_after))
   AND NOT EXISTS (SELECT 1 FROM {LIVE} AS w WHERE w.fallback_after = n.id
                      AND w.status = 'scheduled' AND w.reason = 'fallback_waiting')"""


def _move_sql(candidates: str, order: str) -> str:
    holds = "".join(f"\n   AND NOT ({c})" for c in _HOLDS.values())
    return f"""
WITH moved AS (
    DELETE FROM {LIVE} WHERE id IN (
        SELECT n.id FROM {LIVE} AS n
         WHERE {candidates}{_keep_for_fallback()}{holds}
         ORDER BY n.{order}
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED)
    RETURNING *)
{into_history("moved")}
"""


_STATUSES = ", ".join(f"'{s}'" for s in FINISHED)
#: Finished rows through ``notification_finished_idx`` (its predicate spelled as the index's).
FINISHED_ROWS = f"n.status IN ({_STATUSES}) AND n.dead_lettered_at IS NULL AND n.updated_at < %(cutoff)s"
#: Dead letters nobody replayed within ``DEAD_LETTER_DAYS``, through ``notification_dead_letter_idx``.
EXPIRED_DEAD_LETTERS = ("n.dead_lettered_at IS NOT NULL AND n.dead_lettered_at < %(expired)s "
                        "AND n.status = 'failed' AND n.updated_at < %(cutoff)s")


def hot_cutoff(now: datetime) -> datetime:
    """Rows last changed before this may move (``NOTIFY["HOT_HOURS"]`` before ``now``)."""
    return now - timedelta(hours=float(settings.NOTIFY["HOT_HOURS"]))


def archive(now: datetime, limit: int) -> int:
    """Move up to ``limit`` finished rows last changed before :func:`hot_cutoff` to the history in
    batches of ``NOTIFY["ARCHIVE_BATCH_SIZE"]``, each batch one statement in its own transaction;
    expired dead letters first. Returns how many moved."""
    size = max(1, int(settings.NOTIFY["ARCHIVE_BATCH_SIZE"]))
    params = {"cutoff": hot_cutoff(now), "archived_at": now,
              "expired": now - timedelta(days=int(settings.NOTIFY["DEAD_LETTER_DAYS"]))}
    moved = 0
    for candidates, order in ((EXPIRED_DEAD_LETTERS, "dead_lettered_at"), (FINISHED_ROWS, "updated_at")):
        sql = _move_sql(candidates, order)
        while moved < limit:
            batch = min(size, limit - moved)
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute(sql, {**params, "limit": batch})
                count = cur.rowcount
            moved += count
            if count < batch:
                break
    return moved


def archived(q: Q, since: datetime, **annotations) -> list[ArchivedNotification]:
    """The history's rows matching ``q`` (over ``annotations``, if given) archived at or after
    ``since`` (the bound prunes the day partitions read), with their recipients and ``archived_at``,
    as :class:`ArchivedNotification` (never saved)."""
    return [_as_notification(h) for h in (NotificationHistory.objects.select_related("recipient")
                                          .annotate(**annotations).filter(q, archived_at__gte=since))]


def locked(rows: QuerySet[NotificationHistory]) -> ArchivedNotification | None:
    """The one history row ``rows`` selects (the caller's rule, filtered by id: a primary-key probe
    of every partition), locked ``FOR NO KEY UPDATE`` to the end of the transaction, or None: what
    a write to an archived row holds while it decides (an app receipt), as the live row's lock does."""
    h = rows.select_related("recipient").select_for_update(of=("self",), no_key=True).first()
    return _as_notification(h) if h is not None else None


def partition_key(n: Notification) -> datetime:
    """The history's partition-key value of the archived row ``n`` (its ``archived_at``): what
    :func:`in_history` needs to read one partition."""
    key = getattr(n, "archived_at", None)
    assert key is not None, "an archived row read through this module carries archived_at"
    return key


def _as_notification(h: NotificationHistory) -> ArchivedNotification:
    names = [f.attname for f in Notification._meta.concrete_fields]
    n = ArchivedNotification.from_db(connection.alias, names, [getattr(h, a) for a in names])
    n.recipient, n.archived_at = h.recipient, h.archived_at
    return n


def archived_by_id(ids: Iterable, since: datetime) -> list[ArchivedNotification]:
    """:func:`archived` by primary key."""
    return archived(Q(pk__in=list(ids)), since)


def exists(pk, since: datetime) -> bool:
    """Whether ``pk`` is live, or in the history archived at or after ``since``: one statement, the
    history probed (a key probe per partition read) only when the row is not live."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {LIVE} WHERE id = %s) OR EXISTS (SELECT 1 FROM {HISTORY} "
                    "WHERE id = %s AND archived_at >= %s)", [pk, pk, since])
        return bool(cur.fetchone()[0])


def receipt_window(now: datetime) -> datetime:
    """The oldest archival a receipt's row in the history may have (:data:`RECEIPT_WINDOW` before
    ``now``, whenever the row was created)."""
    return now - RECEIPT_WINDOW


def idempotency_window(now: datetime) -> datetime:
    """The oldest archival an archived send replays from: the whole history. A key is honoured as
    long as its row exists, since its derived id is the row's: a shorter window let a retry insert a
    second row with the same id beside the archived one (one id, two notifications)."""
    return datetime.min.replace(tzinfo=UTC)


def live_rows_estimate() -> int:
    """The live table's row count as the planner last estimated it (``pg_class.reltuples``, no scan)."""
    with connection.cursor() as cur:
        cur.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s::regclass", [LIVE])
        row = cur.fetchone()
    return int(row[0]) if row else 0

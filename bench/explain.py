"""EXPLAIN of the hot queries on the bench database after a run (the JSON's ``explain``;
docs/PERFORMANCE.md, "A bench that has lived").

Each query is the SQL the code runs, never a copy: the owning function is called inside a
transaction that is rolled back and its statements are captured (a write path stops before its
first statement runs), or the owning module's SQL constant is given its parameters. Per query: the
plan's node types and ``seq_scan``: whether any table of more than :data:`BIG_TABLE_ROWS` rows is
read by a sequential scan.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

from django.conf import settings
from django.db import connection, transaction
from django.http import QueryDict

from core import clock
from core.api.pagination import list_page
from core.queues import SEND_QUEUES
from notifications import lifecycle, receipts, scheduler
from notifications.api import views
from notifications.campaign_rows import campaign_has_open_notifications
from notifications.models import APIClient, Notification
from notifications.readers import readable_notifications
from preferences.models import Recipient
from providers.receipts import Receipt

BIG_TABLE_ROWS = 10_000
#: A statement is one of a query's when it reads one of these (savepoints and other tables' reads are not).
TABLES = ("notifications_notification", "notifications_notificationhistory", "notifications_notificationrecord",
          "notifications_deliveryattempt", "notifications_deliveryevent", "notifications_timeline")


class _Stop(BaseException):
    """Raised in place of a write path's first statement: it never runs."""


def captured(fn: Callable, *args, first: bool = False, **kwargs) -> list[tuple[str, object]]:
    """The statements (SQL, params) ``fn(*args, **kwargs)`` sends that read :data:`TABLES`, in a transaction
    rolled back afterwards; ``first``: only the first, which is not executed (write paths)."""
    statements: list[tuple[str, object]] = []

    def wrapper(execute, sql, params, many, context):
        if any(table in sql for table in TABLES) and not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE")):
            statements.append((sql, params))
            if first:
                raise _Stop
        return execute(sql, params, many, context)

    with transaction.atomic():
        try:
            with connection.execute_wrapper(wrapper):
                fn(*args, **kwargs)
        except _Stop:
            pass
        transaction.set_rollback(True)
    return statements


def _samples() -> SimpleNamespace:
    """Real values to plan with: recent ids, a provider message id, a campaign, a recipient with
    history, an API client."""
    batch = settings.NOTIFY["BATCH_SIZE"]["email"]
    recent = list(Notification.objects.order_by("-created_at").values_list("id", flat=True)[:batch])
    ids = [str(i) for i in recent] or [str(uuid.uuid4()) for _ in range(batch)]
    sent = (Notification.objects.exclude(provider_message_id="").order_by("-created_at")
            .values("provider_message_id", "provider").first())
    campaign = Notification.objects.filter(campaign_id__isnull=False).order_by("-created_at").values_list(
        "campaign_id", flat=True).first()
    newest = Notification.objects.order_by("-created_at").values_list("recipient_id", flat=True).first()
    recipient = (Recipient.objects.filter(user_id="bh-0000000").first()  # a recipient of the history fill
                 or Recipient.objects.filter(pk=newest).first())
    client = (APIClient.objects.filter(name__startswith="bench-history-").order_by("-created").first()
              or APIClient.objects.order_by("-created").first())
    readable = (readable_notifications(client).order_by("-created_at").values_list("pk", flat=True).first()
                if client is not None else None)
    return SimpleNamespace(ids=ids, readable=str(readable or ids[0]),
                           pmid=(sent or {}).get("provider_message_id", "SMbench"),
                           provider=(sent or {}).get("provider") or "twilio",
                           campaign=str(campaign or uuid.uuid4()), recipient=recipient, client=client)


def _probes(s: SimpleNamespace) -> dict[str, Callable[[], list[tuple[str, object]]]]:
    now = clock.now()
    notify = settings.NOTIFY
    stale = notify["QUEUED_STALE_SECONDS"]
    probes: dict[str, Callable[[], list[tuple[str, object]]]] = {
        "claim": lambda: captured(lifecycle.claim, s.ids, now + timedelta(seconds=notify["LEASE_SECONDS"]), now,
                                  first=True),
        "due_scan": lambda: captured(lifecycle.release_due, now, notify["RELEASE_BATCH_SIZE"], first=True),
        "expired_leases": lambda: captured(scheduler._expired_leases, now, 1000, first=True),
        "stale_queued": lambda: [(scheduler._STALE_QUEUED_SQL, {
            "now": now, "limit": 1000, "drained": list(SEND_QUEUES),
            "high_before": now - timedelta(seconds=stale["high"]),
            "standard_before": now - timedelta(seconds=stale["standard"])})],
        "receipt_by_provider_message_id": lambda: captured(receipts._find_all, [Receipt(
            provider=s.provider, dedup_key="bench:explain", kind="delivered", raw="delivered",
            provider_message_id=s.pmid)]),
        "campaign_completion": lambda: captured(campaign_has_open_notifications, s.campaign),
    }
    if s.client is not None:
        probes["notification_by_id"] = lambda: captured(views.NotificationDetailView().get,
                                                        SimpleNamespace(auth=s.client), s.readable)
        if s.recipient is not None:
            probes["recipient_history_page"] = lambda: captured(
                list_page, QueryDict(""), readable_notifications(s.client).filter(recipient=s.recipient),
                views._NEWEST_FIRST, lambda rows: rows, views._USER_NOTIFICATION_FILTERS,
                listing=("user_notifications", s.recipient.pk))
    return probes


def hot_queries() -> dict[str, dict]:
    """``{query: {"node_types", "seq_scan", "seq_scans", "statements", "sql"}}`` for each hot query."""
    probes = _probes(_samples())
    out: dict[str, dict] = {}
    with connection.cursor() as cur:
        for name, probe in probes.items():
            try:
                statements = probe()
                plans = []
                for sql, params in statements:
                    cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                    plan = cur.fetchone()[0]
                    plans.append(json.loads(plan) if isinstance(plan, str) else plan)
                out[name] = summarize(plans, [sql for sql, _ in statements])
            except Exception as exc:  # one query's failure does not hide the others
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def summarize(plans: list, sqls: list[str]) -> dict:
    """Node types and sequential scans of big tables over ``plans`` (EXPLAIN (FORMAT JSON) output)."""
    nodes: list[dict] = []
    for plan in plans:
        for top in plan:
            _walk(top["Plan"], nodes)
    scanned = sorted({n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan" and "Relation Name" in n})
    big = [t for t in scanned if row_estimate(t) > BIG_TABLE_ROWS]
    return {"node_types": sorted({n["Node Type"] for n in nodes}), "seq_scan": bool(big), "seq_scans": big,
            "relations": sorted({n["Relation Name"] for n in nodes if "Relation Name" in n}),
            "statements": len(plans), "sql": [" ".join(sql.split())[:200] for sql in sqls]}


def _walk(node: dict, out: list[dict]) -> None:
    out.append(node)
    for child in node.get("Plans", ()):
        _walk(child, out)


def row_estimate(table: str) -> float:
    """Rows of ``table``: the planner's estimate, or a bounded count when it was never analyzed."""
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cur.fetchone()
        if row and row[0] >= 0:
            return float(row[0])
        cur.execute(f'SELECT count(*) FROM (SELECT 1 FROM "{table}" LIMIT {BIG_TABLE_ROWS + 1}) AS t')
        return float(cur.fetchone()[0])

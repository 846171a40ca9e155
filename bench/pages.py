"""``manage.py bench_pages``: issue 27's admin pages and beat's two samplers, measured on a database with
a campaign of a million recipients sending and days of history behind it (bench/pages_fill.py;
docs/PERFORMANCE.md, "Admin pages at scale").

Each page is requested by its admin URL through ``django.test.Client``, logged in as staff of the
role that uses it, so whatever code sits behind a page, the bench measures what the page costs; each
sampler tick is beat's own task, run in a transaction rolled back (the next tick and the next run
find the same database). The platform clock is pinned to the fill's anchor before every request, so
the pace sample is as fresh as beat leaves it and the provider minutes are the last hour's. Per
target: queries, wall ms and this process's CPU (medians of ``repeat`` runs), its Postgres backend's
CPU (bench/db_cpu.py; the mean of the runs, counted in 10-ms ticks; the parallel workers a plan
launches have their own, not in it: EXPLAIN says how many), and EXPLAIN (ANALYZE, BUFFERS) of the
median run's slowest query and of any other over :data:`HEAVY_MS`. A target over :data:`SLOW_MS`,
or whose explained queries scan a big table sequentially or read :data:`BIG_READ_ROWS` rows or more
in one scan, is flagged.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from bench import history, pages_fill
from bench.db_cpu import backend_cpu
from bench.explain import BIG_TABLE_ROWS, row_estimate
from campaigns import roles, tally
from campaigns import tasks as campaign_tasks
from campaigns.models import CampaignTally
from notifications import tasks as notification_tasks

REPEAT = 5
SLOW_MS = 200
HEAVY_MS = 50
BIG_READ_ROWS = 100_000
#: Tables whose sizes the JSON reports (a partitioned one summed over its partitions).
SIZED = ("notifications_notification", "notifications_notificationhistory", "notifications_deliveryattempt",
         "notifications_deliveryevent", "campaigns_campaign", "campaigns_campaignminute",
         "notifications_providerminute", "preferences_recipient", "campaigns_segmentmember")


@dataclass(frozen=True)
class Target:
    """One thing measured: a page (``role``'s GET of ``url``) or a sampler tick (``tick``)."""

    name: str
    what: str
    role: str = ""
    url: str = ""
    tick: Callable[[], object] | None = None


def targets(fill: dict) -> list[Target]:
    campaign, recipient = fill["campaign_id"], fill["recipient_id"]
    return [
        Target("tick_pace_first", "beat tick: a campaign's first sample (one full count)",
               tick=lambda: _first_tick(campaign)),
        Target("campaign_page", "campaign change page (sending, 1 M rows)", roles.MARKETING,
               reverse("admin:campaigns_campaign_change", args=[campaign])),
        Target("pace_poll", "its 3-s progress and pace poll (JSON)", roles.MARKETING,
               reverse("admin:campaigns_campaign_progress", args=[campaign])),
        Target("campaign_list", "campaign list (refreshes every 5 s while one is active)", roles.MARKETING,
               reverse("admin:campaigns_campaign_changelist")),
        Target("provider_health", "provider health page (last hour charts)", roles.SUPPORT,
               reverse("admin:provider_health")),
        Target("recipient_page", "recipient page with the 30-day timeline", roles.SUPPORT,
               reverse("admin:preferences_recipient_change", args=[quote(recipient)])),
        Target("tick_pace", "beat tick: campaigns.sample_pace, a later one", tick=campaign_tasks.sample_pace),
        Target("tick_provider_minutes", "beat tick: notifications.sample_provider_minutes (a minute of calls)",
               tick=notification_tasks.sample_provider_minutes),
    ]


def _first_tick(campaign_id: str) -> None:
    """The tick as it finds a campaign it never sampled (its tally dropped first; :func:`_call` rolls
    both back): the one full count a campaign costs."""
    CampaignTally.objects.filter(campaign_id=campaign_id).delete()
    campaign_tasks.sample_pace()


def staff_client(role: str) -> Client:
    """A client logged in as staff of ``role`` only (never a superuser)."""
    user, _ = User.objects.get_or_create(username=f"bench-pages-{role}", defaults={"is_staff": True})
    user.groups.set([Group.objects.get(name=role)])
    client = Client()
    client.force_login(user)
    return client


def _call(target: Target, client: Client | None) -> int:
    """Run ``target`` once: the response's bytes (a page answering anything but 200 raises); a tick:
    0, its writes rolled back."""
    if target.tick is not None:
        with transaction.atomic():
            target.tick()
            transaction.set_rollback(True)
        return 0
    assert client is not None, target.name
    response = client.get(target.url, secure=True)
    body = response.content
    if response.status_code != 200:
        raise RuntimeError(f"{target.name}: GET {target.url} answered {response.status_code}: {body[:300]!r}")
    return len(body)


@dataclass
class Run:
    """One measured run of a target."""

    wall_ms: float
    cpu_ms: float
    db_cpu_ms: float | None
    queries: list[dict]
    bytes: int


def measure(target: Target, pinned: pages_fill.PinnedClock, anchor: datetime, repeat: int = REPEAT) -> dict:
    """One warm-up, then ``repeat`` measured runs with the clock pinned to ``anchor``; the figures of
    the median run by wall time, and EXPLAIN (ANALYZE, BUFFERS) of its slowest queries."""
    client = staff_client(target.role) if target.role else None
    pinned.pin(anchor)
    _call(target, client)
    runs: list[Run] = []
    for _ in range(repeat):
        pinned.pin(anchor)
        db0 = backend_cpu()
        cpu0, t0 = time.process_time(), time.perf_counter()
        with CaptureQueriesContext(connection) as captured:
            size = _call(target, client)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        db1 = backend_cpu()
        runs.append(Run(wall * 1000, cpu * 1000, None if db0 is None or db1 is None else (db1 - db0) * 1000,
                        list(captured.captured_queries), size))
    median = sorted(runs, key=lambda r: r.wall_ms)[len(runs) // 2]
    statements = [q for q in median.queries if _explainable(q["sql"])]
    ranked = sorted(statements, key=lambda q: float(q["time"]), reverse=True)
    pinned.pin(anchor)
    explained = [explain_analyze(q["sql"]) | {"captured_ms": round(float(q["time"]) * 1000, 1)}
                 for i, q in enumerate(ranked[:4]) if i == 0 or float(q["time"]) * 1000 >= HEAVY_MS]
    db_cpu = [r.db_cpu_ms for r in runs if r.db_cpu_ms is not None]
    found = {
        "what": target.what, "role": target.role or None, "url": target.url or None,
        "queries": len(median.queries), "queries_per_run": [len(r.queries) for r in runs],
        "wall_ms": round(statistics.median(r.wall_ms for r in runs), 1),
        "wall_ms_runs": [round(r.wall_ms, 1) for r in runs],
        "cpu_ms": round(statistics.median(r.cpu_ms for r in runs), 1),
        # The kernel counts a process's CPU in ticks (10 ms): the mean of the runs, not one run's.
        "db_cpu_ms": round(statistics.mean(db_cpu), 1) if len(db_cpu) == len(runs) else None,
        "bytes": median.bytes, "explained": explained,
    }
    return found | {"flags": flags(found)}


def _explainable(sql: str) -> bool:
    return sql.lstrip().split(None, 1)[0].upper() in ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE")


def explain_analyze(sql: str) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of a captured statement (its parameters inlined, as Django logs it),
    in a transaction rolled back: execution ms, buffers, sequential scans of big tables, and the scan
    that read the most rows (rows returned + removed by a filter or recheck, × loops)."""
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cur.fetchone()[0]
        transaction.set_rollback(True)
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]
    nodes: list[dict] = []
    _walk(top["Plan"], nodes)
    scans = [n for n in nodes if "Scan" in n["Node Type"] and "Relation Name" in n]
    widest = max(scans, key=_rows_read, default=None)
    seq = sorted({n["Relation Name"] for n in scans if n["Node Type"] == "Seq Scan"})
    return {
        "execution_ms": round(top["Execution Time"], 1), "planning_ms": round(top["Planning Time"], 1),
        "shared_hit_blocks": top["Plan"].get("Shared Hit Blocks", 0),
        "shared_read_blocks": top["Plan"].get("Shared Read Blocks", 0),
        "node_types": sorted({n["Node Type"] for n in nodes}),
        # Parallel workers' CPU is theirs, not the backend's (db_cpu_ms counts the backend alone).
        "parallel_workers": sum(n.get("Workers Launched", 0) for n in nodes),
        "seq_scans_of_big_tables": [t for t in seq if row_estimate(t) > BIG_TABLE_ROWS],
        "largest_scan": {"node": widest["Node Type"], "relation": widest["Relation Name"],
                         "index": widest.get("Index Name"), "rows_read": _rows_read(widest)} if widest else None,
        "sql": " ".join(sql.split())[:400],
    }


def _walk(node: dict, out: list[dict]) -> None:
    out.append(node)
    for child in node.get("Plans", ()):
        _walk(child, out)


def _rows_read(node: dict) -> int:
    per_loop = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0))
    return int(per_loop * node.get("Actual Loops", 1))


def flags(found: dict) -> list[str]:
    """What the lead should look at: slow, or reading a big table's rows (module docstring)."""
    out = [f"{found['wall_ms']:,.0f} ms (over {SLOW_MS} ms)"] if found["wall_ms"] > SLOW_MS else []
    for plan in found["explained"]:
        for table in plan["seq_scans_of_big_tables"]:
            out.append(f"sequential scan of {table}")
        scan = plan["largest_scan"]
        if scan and scan["rows_read"] >= BIG_READ_ROWS:
            out.append(f"{scan['node']} of {scan['relation']} read {scan['rows_read']:,} rows"
                       + (f" ({scan['index']})" if scan["index"] else ""))
    return list(dict.fromkeys(out))


def database() -> dict:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_database_size(current_database())")
        total = cur.fetchone()[0]
    return {"bytes": total, "tables": history.sizes(SIZED)}


def run(request: pages_fill.Request, progress: Callable[[str], None], *, repeat: int = REPEAT,
        refill: bool = False) -> dict:
    """Fill (or reuse) the database of ``request``, measure every :func:`targets`; returns the JSON."""
    logging.getLogger("axes").setLevel(logging.WARNING)  # a line per staff login otherwise
    fill = pages_fill.ensure(request, progress, refill=refill)
    started = datetime.now(UTC)
    results: dict[str, dict] = {}
    pinned = pages_fill.PinnedClock()
    try:
        for target in targets(fill):
            progress(f"pages: measuring {target.name}…")
            results[target.name] = measure(target, pinned, fill["anchor"], repeat)
            if target.name == "tick_pace_first":  # what beat does within 15 s of a launch: the tally
                pinned.pin(fill["anchor"])         # the pages and later ticks read from then on, and
                campaign_tasks.sample_pace()       # what its ticks do to the older campaigns, one each
                for _ in range(100):
                    with transaction.atomic():
                        if not tally.lock() or tally.backfill(fill["anchor"]) is None:
                            break
    finally:
        pinned.close()
    return {"schema": 1, "started_at": started.isoformat(timespec="seconds"), "repeat": repeat,
            "fill": {**fill, "anchor": fill["anchor"].isoformat()}, "database": database(), "results": results,
            "flags": {name: r["flags"] for name, r in results.items() if r["flags"]}}


def table(result: dict) -> str:
    """The stdout table: one line per target."""
    lines = ["| target | queries | wall ms (median) | CPU ms | Postgres CPU ms | slowest query ms | its largest scan "
             "(rows read) | flags |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for name, r in result["results"].items():
        slowest = r["explained"][0] if r["explained"] else None
        scan = slowest["largest_scan"] if slowest else None
        cells = [name, str(r["queries"]), f"{r['wall_ms']:,.1f}", f"{r['cpu_ms']:,.1f}",
                 "–" if r["db_cpu_ms"] is None else f"{r['db_cpu_ms']:,.1f}",
                 (f"{slowest['execution_ms']:,.1f}" + (f" ({slowest['parallel_workers']} parallel workers)"
                                                       if slowest["parallel_workers"] else "")) if slowest else "–",
                 f"{scan['node']} {scan['relation']} ({scan['rows_read']:,})" if scan else "–",
                 "; ".join(r["flags"]) or "–"]
        lines.append("| " + " | ".join(cells) + " |")
    size, anchor = result["database"]["bytes"] / 2**30, result["fill"]["anchor"]
    return "\n".join(lines) + f"\n\ndatabase {size:,.2f} GB; the clock pinned at the fill's anchor {anchor}"

"""One measured run: start the bench stack, (optionally) the reference ceilings (:mod:`bench.ceilings`),
then a campaign blast with an OTP stream through the API, until the campaign is drained; collect what
the database, the emulator and the process monitor saw. :func:`run_naive` does the same for the naive
baseline (:mod:`bench.naive`). The figures are computed by :mod:`bench.report`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import requests
from django.db import connection

from bench import history, procs, receipts, report, seed
from bench.ceilings import delete_durable_rows, run_ceiling
from bench.emulator import BACKUP_SMS_ACCOUNT, PRIMARY_SMS_ACCOUNT, PROVIDER_OF_CHANNEL, Emulator
from bench.otp import OtpSender
from bench.production_stack import BenchStack
from bench.webhook_bench import WebhookBench
from campaigns.models import Campaign
from core.api.scopes import Scope
from notifications.models import APIClient

BUCKET_MS = 100
#: Brownout: OTPs keep flowing at least this long after the primary SMS provider slowed down.
BROWNOUT_OBSERVE_MS = 30_000
OTP_USERS = 1000
#: Tables emptied before each run (the bench database is the bench's alone): notifications,
#: campaigns and events with everything that references them, but a history fill (bench/history.py).
#: Recipients, devices and segments stay.
RESET_TABLES = ("notifications_notification", "campaigns_campaign", "notifications_event")
PLATFORM_KINDS = ("web", "worker_high", "worker_standard", "worker_fanout", "worker_maintenance", "worker_receipts",
                  "beat", "postgres", "redis", "worker_webhooks")


@dataclass
class RunConfig:
    pipeline: str  # "tiered" | "naive" (run_naive)
    recipients: int
    channel: str
    otp_rate: float
    otp_channels: list[str]
    provider_rate: float | None = None
    provider_latency_ms: int | None = None
    brownout: bool = False
    ceiling_seconds: float = 0.0  # > 0: measure the reference ceilings first on this stack's emulator
    naive_pool: str = "prefork"  # the naive baseline's workers (bench.production_stack.BenchStack)
    naive_concurrency: int = 8
    drain_timeout: float | None = None
    stall_timeout: float = 180.0
    label: str = ""
    receipts: bool = False  # the emulator sends delivery receipts (bench/receipts.py)
    webhooks: bool = False  # the campaign's client has an endpoint for every event (bench/webhook_bench.py)
    webhooks_receiver_down: float = 0.0  # seconds the receiver refuses connections, from a third of the campaign
    min_window: float = 0.0  # > 0: measure launch → end over at least this long (idle after the drain, no OTP)
    env: dict[str, str] = field(default_factory=dict)

    def timeout(self) -> float:
        return self.drain_timeout or max(300.0, self.recipients / 100.0)

    @property
    def stall(self) -> float:
        return min(self.stall_timeout, self.timeout())


def reset_state(redis_url: str) -> None:
    """Empty the bench database's notification, campaign and event tables of what earlier runs made
    (a history fill stays: :func:`bench.history.reset_run_rows`) and the bench Redis database."""
    history.reset_run_rows(RESET_TABLES)
    import redis

    redis.Redis.from_url(redis_url).flushdb()


def _port(url: str) -> int | None:
    return urlsplit(url).port


def monitor_for(stack: BenchStack, database_url: str, redis_url: str) -> procs.ProcessMonitor:
    """A process monitor of every process of ``stack`` (one kind each) and of the Postgres and Redis
    servers behind the two URLs (Postgres: only the backends of the bench's own database)."""
    pg_pid, redis_pid = procs.listening_pid(_port(database_url)), procs.listening_pid(_port(redis_url))
    kinds = {name: (lambda n=name: stack.pids(n)) for name in stack.commands()}
    kinds["postgres"] = lambda: [pg_pid] if pg_pid else []
    kinds["redis"] = lambda: [redis_pid] if redis_pid else []
    return procs.ProcessMonitor(kinds, postgres_database=urlsplit(database_url).path.lstrip("/"))


def start_tiered_stack(env: dict, provider_rate: float | None, database_url: str, redis_url: str, work_dir: Path,
                       label: str, progress: Callable[[str], None],
                       with_receipts: bool = False,
                       with_webhooks: bool = False) -> tuple[BenchStack, procs.ProcessMonitor, Emulator]:
    """The platform as it runs (tiered pipeline), started with ``env`` (and ``provider_rate`` as
    ``PROVIDER_RATE_PER_S``), its process monitor running, and a client of its emulator;
    ``with_receipts``: the emulator sends delivery receipts (:data:`bench.receipts.RULES`);
    ``with_webhooks``: the webhook worker runs too."""
    env = dict(env)
    if provider_rate:
        env["PROVIDER_RATE_PER_S"] = str(provider_rate)
    stack = BenchStack(database_url, redis_url, work_dir / label, pipeline="tiered", env=env, log_dir=work_dir,
                       receipts=with_receipts, webhooks=with_webhooks)
    monitor = monitor_for(stack, database_url, redis_url)
    progress(f"[{label}] starting the stack ({', '.join(stack.commands())})…")
    stack.start_all()
    monitor.start()
    emulator = Emulator(stack.emulator)
    if with_receipts:
        receipts.install(emulator)
    return stack, monitor, emulator


def run_blast(cfg: RunConfig, database_url: str, redis_url: str, work_dir: Path,
              progress: Callable[[str], None]) -> dict:
    label = cfg.label or cfg.pipeline
    reset_state(redis_url)
    segment, seed_seconds = seed.ensure_segment(cfg.recipients, progress)
    otp_users = seed.ensure_otp_recipients(OTP_USERS)
    campaign_client, campaign_key = APIClient.objects.create_key(name=f"bench-campaigns-{uuid.uuid4().hex[:6]}",
                                                                 scopes=[Scope.CAMPAIGNS_WRITE, Scope.READ])
    # Before the stack starts: every process reads the subscription at its first move.
    webhooks = WebhookBench(campaign_client, work_dir / label, cfg.webhooks_receiver_down) if cfg.webhooks else None
    _, otp_key = APIClient.objects.create_key(name=f"bench-otp-{uuid.uuid4().hex[:6]}", allow_high=True)

    try:
        stack, monitor, emulator = start_tiered_stack(cfg.env, cfg.provider_rate, database_url, redis_url, work_dir,
                                                      label, progress, with_receipts=cfg.receipts,
                                                      with_webhooks=cfg.webhooks)
    except BaseException:
        if webhooks:
            webhooks.stop()
        raise
    result: dict = {"label": label, "pipeline": cfg.pipeline, "recipients": cfg.recipients, "channel": cfg.channel,
                    "segment": segment.segment_id, "seed_seconds": round(seed_seconds, 1),
                    "otp_channels": cfg.otp_channels, "otp_rate": cfg.otp_rate,
                    "commands": {n: " ".join(c) for n, c in stack.commands().items()},
                    "env": {k: v for k, v in stack.env().items()
                            if k in ("PROVIDER_RATE_PER_S", "PROVIDER_HIGH_RESERVED_FRACTION",
                                     "EMULATOR_RECEIPTS", "LOG_LEVEL", "API_DEFAULT_RATE_LIMIT")},
                    "receipts": None}
    try:
        faults = apply_faults(emulator, cfg)
        result["faults"] = faults
        if cfg.ceiling_seconds > 0:
            result.update(_ceilings(cfg, stack, monitor, progress, label))
        sender = OtpSender(stack.api, otp_key, otp_users, cfg.otp_channels, cfg.otp_rate)
        warm_up(stack, emulator, sender, cfg, campaign_key, progress)
        clear_messages(emulator)
        result.update(_blast(cfg, stack, emulator, monitor, sender, segment.segment_id, campaign_key, progress, label,
                             webhooks))
    finally:
        monitor.stop()
        result["dead_processes"] = stack.dead()
        stack.stop_all()
        if webhooks:
            webhooks.stop()
    return result


def _ceilings(cfg: RunConfig, stack: BenchStack, monitor, progress, label: str) -> dict:
    """The reference points on this stack's emulator (bench.ceilings): for email the raw ceiling
    (``send_batch`` without a database), for SMS and push the SDK ceiling (the same loop) and the
    pooled-aiohttp probe; for every channel the durable ceiling, whose rows are deleted afterwards."""
    out = {}
    seconds = cfg.ceiling_seconds
    name = "raw_ceiling" if cfg.channel == "email" else "sdk_ceiling"
    progress(f"[{label}] {name.replace('_', ' ')}: {cfg.channel} send_batch in a loop for {seconds:.0f} s…")
    out[name] = run_ceiling(cfg.channel, stack.env(), monitor, seconds=seconds, mode="sdk")
    progress(f"[{label}] {name.replace('_', ' ')}: {out[name]['msgs_per_s']} msgs/s")
    progress(f"[{label}] durable ceiling: insert, send_batch, mark sent, in a loop for {seconds:.0f} s…")
    out["durable_ceiling"] = run_ceiling(cfg.channel, stack.env(), monitor, seconds=seconds, mode="durable")
    out["durable_ceiling"]["rows_deleted_after"] = delete_durable_rows()
    progress(f"[{label}] durable ceiling: {out['durable_ceiling']['msgs_per_s']} msgs/s")
    if cfg.channel in ("sms", "push"):
        progress(f"[{label}] the same requests over pooled aiohttp, no SDK…")
        out["raw_http_transport"] = run_ceiling(cfg.channel, stack.env(), monitor, seconds=min(seconds, 10.0),
                                                mode="http")
        progress(f"[{label}] pooled aiohttp: {out['raw_http_transport']['msgs_per_s']} msgs/s")
    return out


def apply_faults(emulator: Emulator, cfg: RunConfig) -> list[dict]:
    """Emulator rules: rate limits first (they fire only when their bucket is empty), then latency."""
    rules = []
    if cfg.provider_rate:
        for provider in ("twilio", "sendgrid", "fcm"):
            rules.append({"provider": provider, "status": 429, "rate_limit_per_s": cfg.provider_rate})
    if cfg.provider_latency_ms:
        rules.append({"provider": "*", "latency_ms": int(cfg.provider_latency_ms)})
    return [emulator.add_fault(**rule) for rule in rules]


def clear_messages(emulator: Emulator) -> None:
    for path in ("messages", "stats"):
        emulator.http.delete(f"{emulator.base}/_emulator/{path}", timeout=30).raise_for_status()


def warm_up(stack, emulator: Emulator, sender: OtpSender, cfg: RunConfig, campaign_key: str, progress) -> None:
    """A few OTPs per channel, one after another, so first-request costs (imports, connections,
    OAuth tokens) are not measured."""
    before = emulator.count()
    records = [sender.send_one(ch, sender.user_ids[i]) for i in range(3) for ch in sorted(set(cfg.otp_channels))]
    bad = [r for r in records if r["id"] is None]
    if bad:
        raise RuntimeError(f"warm-up OTP refused by the API: {bad[0]}")
    deadline = time.monotonic() + 60
    while emulator.count() < before + len(records):
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm-up OTPs did not reach the emulator within 60 s (dead: {stack.dead()})")
        time.sleep(0.2)


def _blast(cfg: RunConfig, stack, emulator: Emulator, monitor, sender: OtpSender, segment_id: str,
           campaign_key: str, progress, label: str, webhooks: WebhookBench | None = None) -> dict:
    provider = PROVIDER_OF_CHANNEL[cfg.channel]
    monitor.mark("start")
    sender.start()
    time.sleep(2.0)  # OTPs before the blast: the unloaded baseline
    monitor.mark("launch")
    steal0, busy0 = procs.steal_seconds(), procs.busy_seconds()
    launch_ms = time.time() * 1000
    r = requests.post(f"{stack.api}/v1/campaigns", timeout=60,
                      headers={"Authorization": f"Api-Key {campaign_key}", "Idempotency-Key": uuid.uuid4().hex},
                      json={"segment_id": segment_id, "channel": cfg.channel, "name": f"bench {label}",
                            "content": ({"body": "Hello {{ first_name }}"} if cfg.channel == "sms"
                                        else {"title": "Bench", "body": "Hello {{ first_name }}"})})
    if r.status_code != 202:
        raise RuntimeError(f"campaign refused: {r.status_code} {r.text[:500]}")
    campaign_id = r.json()["id"]
    progress(f"[{label}] campaign {campaign_id} launched to {cfg.recipients:,} recipients ({cfg.channel})")
    brownout_ms = None
    last_count, last_progress = -1, time.monotonic()
    deadline = time.monotonic() + cfg.timeout()
    timed_out = False
    next_report = time.monotonic() + 10
    drained_at = None
    while True:
        time.sleep(1.0)
        c = Campaign.objects.values("status", "member_count", "created_count", "fanned_out_at").get(pk=campaign_id)
        count = emulator.count(provider)
        if count != last_count:
            last_count, last_progress = count, time.monotonic()
        expected = c["member_count"] or cfg.recipients
        if cfg.brownout and brownout_ms is None and count >= expected / 3:
            emulator.add_fault(provider="twilio", account=PRIMARY_SMS_ACCOUNT, latency_ms=30_000)
            brownout_ms = time.time() * 1000
            progress(f"[{label}] brownout: primary SMS provider now answers after 30 s")
        if webhooks:
            webhooks.tick(count, expected, progress, label)
        if time.monotonic() >= next_report:
            next_report += 10
            progress(f"[{label}] {time.time() - launch_ms / 1000:.0f} s: {c['status']}, {provider} received {count:,}"
                     f" (campaign {expected:,}), OTPs sent {len(sender.sent)}")
        observed = not cfg.brownout or (brownout_ms is not None
                                        and time.time() * 1000 >= brownout_ms + BROWNOUT_OBSERVE_MS)
        if observed and (c["status"] == "completed"
                         or (c["fanned_out_at"] and count >= expected and not _busy(campaign_id))):
            drained_at = time.time()
            break
        if stack.dead():
            raise RuntimeError(f"platform process(es) exited during the run: {stack.dead()}")
        if time.monotonic() > deadline or time.monotonic() - last_progress > cfg.stall:
            timed_out = True
            drained_at = time.time()
            progress(f"[{label}] drain timed out ({'no progress' if time.monotonic() < deadline else 'deadline'})")
            break
    settled = None
    if cfg.receipts:  # the window goes on until every receipt is applied; no new OTP meanwhile
        sender.stop()
        progress(f"[{label}] drained; waiting for the delivery receipts to be applied…")
        settled = receipts.settle(emulator, max(60.0, cfg.timeout() / 4), progress, label)
        progress(f"[{label}] receipts settled in {settled['seconds']} s after the drain")
    webhooks_settled = None
    if webhooks:  # likewise until the receiver has every webhook the outbox holds
        sender.stop()
        progress(f"[{label}] drained; waiting for every status webhook to reach the receiver…")
        wait = max(300.0, cfg.recipients / 50) + 3 * cfg.webhooks_receiver_down
        webhooks_settled = webhooks.settle(campaign_id, wait, progress, label)
        progress(f"[{label}] webhooks settled in {webhooks_settled['seconds']} s after the drain")
    rest = launch_ms / 1000 + cfg.min_window - time.time()
    if rest > 0:  # the same window as the run this one is compared with: its idle ticks count alike
        sender.stop()
        progress(f"[{label}] drained; measuring {rest:.0f} s more, idle, for a window of {cfg.min_window:.0f} s")
        time.sleep(rest)
    monitor.mark("end")
    steal1, busy1 = procs.steal_seconds(), procs.busy_seconds()
    sender.stop()
    records = sender.records()
    otp_ids = [rec["id"] for rec in records if rec["id"]]
    last_accept = max((rec["accept_ms"] for rec in records), default=0) / 1000
    analysis = emulator.analysis(otp_ids, BUCKET_MS)
    while len(analysis["received_at_ms"]) < len(set(otp_ids)) and time.time() < max(last_accept, drained_at) + 35:
        time.sleep(2.0)
        analysis = emulator.analysis(otp_ids, BUCKET_MS)
    statuses = _statuses(campaign_id)
    campaign = Campaign.objects.values("started_at", "fanned_out_at", "member_count", "created_count",
                                       "status").get(pk=campaign_id)
    window = monitor.marks["end"][0] - monitor.marks["launch"][0]
    cpu = monitor.cpu_between("launch", "end")
    otp_providers = _otp_providers(otp_ids) if cfg.brownout else {}
    return {
        "campaign_id": campaign_id,
        "receipts": receipts.collect(emulator, settled) if settled is not None else None,
        "webhooks": webhooks.collect(webhooks_settled, cpu, statuses) if webhooks and webhooks_settled else None,
        "run": report.summarize_run(
            launch_ms=launch_ms, end_ms=drained_at * 1000, campaign=campaign, statuses=statuses,
            analysis=analysis, otp_records=records, channel=cfg.channel, campaign_provider=provider,
            bucket_ms=BUCKET_MS,
            cpu=cpu, rss=monitor.rss_between(monitor.marks["launch"][0], monitor.marks["end"][0]),
            platform_kinds=PLATFORM_KINDS, timed_out=timed_out, brownout_ms=brownout_ms,
            otp_providers=otp_providers, backup_account=BACKUP_SMS_ACCOUNT),
        "analysis_source": emulator.analysis_source,
        "machine_window": {"seconds": round(window, 1),
                           "steal_pct": round(100 * (steal1 - steal0) / max(1e-9, window * procs.cores()), 1),
                           "busy_pct": round(100 * (busy1 - busy0) / max(1e-9, window * procs.cores()), 1)},
    }


def _busy(campaign_id: str) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM notifications_notification WHERE campaign_id = %s "
                    "AND status IN ('scheduled', 'queued', 'sending'))", [campaign_id])
        return cur.fetchone()[0]


def _statuses(campaign_id: str) -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT status, count(*) FROM notifications_notification WHERE campaign_id = %s GROUP BY status",
                    [campaign_id])
        return dict(cur.fetchall())


def _otp_providers(ids: list[str]) -> dict[str, str]:
    """Provider that sent each OTP (brownout: which SMS went to the backup)."""
    with connection.cursor() as cur:
        cur.execute("SELECT id::text, provider FROM notifications_notification WHERE id = ANY(%s::uuid[])", [ids])
        return dict(cur.fetchall())


def run_naive(cfg: RunConfig, database_url: str, redis_url: str, work_dir: Path,
              progress: Callable[[str], None]) -> dict:
    """The naive baseline (:mod:`bench.naive`) on the same segment shape: the emulator and the naive
    workers only; the bench enqueues its fan-out task and waits until every row is final or the
    time box (``cfg.timeout()``) ends. No OTP stream (the naive design has no API of its own)."""
    from bench.naive import QUEUE, fan_out

    label = cfg.label or "naive"
    reset_state(redis_url)
    segment, seed_seconds = seed.ensure_segment(cfg.recipients, progress)
    stack = BenchStack(database_url, redis_url, work_dir / label, pipeline="naive", env=dict(cfg.env),
                       log_dir=work_dir, naive_pool=cfg.naive_pool, naive_concurrency=cfg.naive_concurrency)
    monitor = monitor_for(stack, database_url, redis_url)
    progress(f"[{label}] starting the naive design ({', '.join(stack.commands())}, pool {cfg.naive_pool} × "
             f"{cfg.naive_concurrency})…")
    stack.start_all()
    monitor.start()
    emulator = Emulator(stack.emulator)
    provider = PROVIDER_OF_CHANNEL[cfg.channel]
    result: dict = {"label": label, "pipeline": "naive", "recipients": cfg.recipients, "channel": cfg.channel,
                    "segment": segment.segment_id, "seed_seconds": round(seed_seconds, 1), "otp_channels": [],
                    "otp_rate": 0, "pool": cfg.naive_pool, "concurrency": cfg.naive_concurrency,
                    "commands": {n: " ".join(c) for n, c in stack.commands().items()}}
    try:
        clear_messages(emulator)
        campaign_id = str(uuid.uuid4())
        monitor.mark("launch")
        steal0, busy0 = procs.steal_seconds(), procs.busy_seconds()
        launch_ms = time.time() * 1000
        fan_out.apply_async((segment.segment_id, cfg.channel, campaign_id, "Bench", "Hello {{ first_name }}"),
                            queue=QUEUE)
        progress(f"[{label}] fan-out task enqueued for {cfg.recipients:,} recipients ({cfg.channel})")
        fanned_out_at = None
        deadline = time.monotonic() + cfg.timeout()
        last_count, last_progress, next_report = -1, time.monotonic(), time.monotonic() + 10
        timed_out = False
        while True:
            time.sleep(1.0)
            statuses = _statuses(campaign_id)
            created = sum(statuses.values())
            if fanned_out_at is None and created >= cfg.recipients:
                fanned_out_at = datetime.now(UTC)
            count = emulator.count(provider)
            if count != last_count:
                last_count, last_progress = count, time.monotonic()
            if time.monotonic() >= next_report:
                next_report += 10
                progress(f"[{label}] {time.time() - launch_ms / 1000:.0f} s: rows {created:,}, {provider} received "
                         f"{count:,}")
            if fanned_out_at and not statuses.get("queued"):
                break
            if stack.dead():
                raise RuntimeError(f"naive process(es) exited during the run: {stack.dead()}")
            if time.monotonic() > deadline or time.monotonic() - last_progress > cfg.stall:
                timed_out = True
                progress(f"[{label}] time box reached ({cfg.timeout():.0f} s): measured over this window")
                break
        drained_at = time.time()
        monitor.mark("end")
        steal1, busy1 = procs.steal_seconds(), procs.busy_seconds()
        statuses = _statuses(campaign_id)
        analysis = emulator.analysis([], BUCKET_MS)
        window = monitor.marks["end"][0] - monitor.marks["launch"][0]
        kinds_measured = [k for k in stack.commands() if k != "emulator"] + ["postgres", "redis"]
        result.update({
            "campaign_id": campaign_id,
            "run": report.summarize_run(
                launch_ms=launch_ms, end_ms=drained_at * 1000,
                campaign={"started_at": datetime.fromtimestamp(launch_ms / 1000, UTC), "fanned_out_at": fanned_out_at,
                          "member_count": cfg.recipients, "created_count": sum(statuses.values())},
                statuses=statuses, analysis=analysis, otp_records=[], channel=cfg.channel,
                campaign_provider=provider, bucket_ms=BUCKET_MS, cpu=monitor.cpu_between("launch", "end"),
                rss=monitor.rss_between(monitor.marks["launch"][0], monitor.marks["end"][0]),
                platform_kinds=kinds_measured, timed_out=timed_out),
            "analysis_source": emulator.analysis_source,
            "machine_window": {"seconds": round(window, 1),
                               "steal_pct": round(100 * (steal1 - steal0) / max(1e-9, window * procs.cores()), 1),
                               "busy_pct": round(100 * (busy1 - busy0) / max(1e-9, window * procs.cores()), 1)},
        })
    finally:
        monitor.stop()
        result["dead_processes"] = stack.dead()
        stack.stop_all()
    return result

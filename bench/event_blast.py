"""The event blast (``manage.py bench --scenario events``, docs/PERFORMANCE.md "Event blast"): N users
(push with one device each, and email), a two-channel notification type defined through
``PUT /v1/notification-types``, then N events of it, one user each, through ``POST /v1/events`` on
the real API (gunicorn) with a bounded number of client connections (:mod:`bench.event_sender`),
while the blast scenario's OTP stream keeps running. The bench waits until every notification of the
blast is final, then collects what the database, the emulator and the process monitor saw; the
figures are computed by :mod:`bench.event_report`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.db import connection

from bench import event_report, procs, seed
from bench.emulator import Emulator
from bench.event_sender import CHANNELS, TYPE_KEY, EventSender, expected_content, type_definition
from bench.otp import OtpSender
from bench.production_stack import BenchStack
from bench.runner import (
    OTP_USERS,
    PLATFORM_KINDS,
    apply_faults,
    clear_messages,
    reset_state,
    start_tiered_stack,
    warm_up,
)
from core.api.scopes import Scope
from notifications.events.models import NotificationType
from notifications.models import APIClient

#: Events sent (to OTP users) and delivered before the blast, so first-request costs are not measured.
WARM_UP_EVENTS = 3
ENV_SHOWN = ("PROVIDER_RATE_PER_S", "EMULATOR_RECEIPTS", "LOG_LEVEL", "API_DEFAULT_RATE_LIMIT")
#: Events whose messages the emulator received are compared with the templates, rendered by hand.
CONTENT_SAMPLES = 3


@dataclass
class EventsConfig:
    events: int
    concurrency: int = 8
    otp_rate: float = 10.0
    otp_channels: list[str] = field(default_factory=lambda: ["email"])
    provider_rate: float | None = None
    provider_latency_ms: int | None = None
    send_seconds: float | None = None  # time box of the sending: no new event after this (None: all)
    drain_timeout: float | None = None
    stall_timeout: float = 180.0
    env: dict[str, str] = field(default_factory=dict)

    def timeout(self) -> float:
        """Seconds from launch to the last delivery before the run is cut off (default: 600 s, or
        20 ms per event if longer)."""
        return self.drain_timeout or max(600.0, self.events / 50.0)

    @property
    def stall(self) -> float:
        return min(self.stall_timeout, self.timeout())


def run_events(cfg: EventsConfig, database_url: str, redis_url: str, work_dir: Path,
               progress: Callable[[str], None]) -> dict:
    label = "events"
    reset_state(redis_url)
    NotificationType.objects.filter(pk=TYPE_KEY).delete()  # its events went with the reset
    segment, seed_seconds = seed.ensure_segment(cfg.events, progress)
    user_ids = seed.member_ids(cfg.events)
    otp_users = seed.ensure_otp_recipients(OTP_USERS)
    suffix = uuid.uuid4().hex[:6]
    _, events_key = APIClient.objects.create_key(name=f"bench-events-{suffix}",
                                                 scopes=[Scope.SEND, Scope.TYPES_WRITE, Scope.READ])
    _, otp_key = APIClient.objects.create_key(name=f"bench-otp-{suffix}", allow_high=True)
    stack, monitor, emulator = start_tiered_stack(cfg.env, cfg.provider_rate, database_url, redis_url, work_dir,
                                                  label, progress)
    result: dict = {"label": label, "events": cfg.events, "concurrency": cfg.concurrency, "type": TYPE_KEY,
                    "segment": segment.segment_id, "seed_seconds": round(seed_seconds, 1),
                    "otp_channels": cfg.otp_channels, "otp_rate": cfg.otp_rate,
                    "commands": {n: " ".join(c) for n, c in stack.commands().items()},
                    "env": {k: v for k, v in stack.env().items() if k in ENV_SHOWN}}
    try:
        result["faults"] = apply_faults(emulator, cfg)
        r = requests.put(f"{stack.api}/v1/notification-types/{TYPE_KEY}", json=type_definition(), timeout=30,
                         headers={"Authorization": f"Api-Key {events_key}"})
        if r.status_code not in (200, 201):
            raise RuntimeError(f"notification type refused: {r.status_code} {r.text[:500]}")
        otp = OtpSender(stack.api, otp_key, otp_users, cfg.otp_channels, cfg.otp_rate)
        warm_up(stack, emulator, otp, cfg, "", progress)
        _warm_up_events(stack, emulator, events_key, otp_users[:WARM_UP_EVENTS])
        clear_messages(emulator)
        result.update(_blast(cfg, emulator, monitor, otp, EventSender(stack.api, events_key, user_ids,
                                                                       cfg.concurrency), stack, progress, label))
    finally:
        monitor.stop()
        result["dead_processes"] = stack.dead()
        stack.stop_all()
    return result


def _warm_up_events(stack: BenchStack, emulator: Emulator, key: str, user_ids: list[str]) -> None:
    before = emulator.count()
    warm = EventSender(stack.api, key, user_ids, concurrency=1)
    warm.run_id = f"warm-{warm.run_id}"
    warm.start()
    warm.join(60)
    bad = [r for r in warm.records if r["status"] != 202]
    if warm.error or bad or len(warm.records) != len(user_ids):
        raise RuntimeError(f"warm-up event refused by the API: {warm.error or (bad[:1] or warm.records)}")
    deadline = time.monotonic() + 60
    while emulator.count() < before + len(user_ids) * len(CHANNELS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm-up events did not reach the emulator within 60 s (dead: {stack.dead()})")
        time.sleep(0.2)


def _blast(cfg: EventsConfig, emulator: Emulator, monitor, otp: OtpSender, sender: EventSender, stack: BenchStack,
           progress, label: str) -> dict:
    monitor.mark("start")
    otp.start()
    time.sleep(2.0)  # OTPs before the blast: the unloaded baseline
    monitor.mark("launch")
    steal0, busy0, client0 = procs.steal_seconds(), procs.busy_seconds(), time.process_time()
    launch_ms = time.time() * 1000
    sender.start()
    progress(f"[{label}] sending {cfg.events:,} events ({'+'.join(CHANNELS)}) over {cfg.concurrency} connections")
    deadline = time.monotonic() + cfg.timeout()
    last_seen, last_progress, next_report = None, time.monotonic(), time.monotonic() + 10
    timed_out = send_time_boxed = False
    while True:
        time.sleep(1.0)
        if (cfg.send_seconds and not sender.done.is_set()
                and time.time() - launch_ms / 1000 >= cfg.send_seconds):
            sender.stop()  # the events in flight finish; what was accepted drains
            send_time_boxed = True
            progress(f"[{label}] sending time-boxed at {cfg.send_seconds:.0f} s: {len(sender.records):,} events "
                     "answered; waiting for them to drain")
        received = sum(emulator.count(p) for p in event_report.PROVIDER.values())
        seen = (len(sender.records), received)
        if seen != last_seen:
            last_seen, last_progress = seen, time.monotonic()
        if time.monotonic() >= next_report:
            next_report += 10
            progress(f"[{label}] {time.time() - launch_ms / 1000:.0f} s: {len(sender.records):,} events answered, "
                     f"push + email received {received:,}, OTPs sent {len(otp.sent)}")
        if sender.done.is_set():
            if sender.error is not None:
                raise RuntimeError(f"event sender failed: {sender.error!r}")
            if not _active():
                break
        if stack.dead():
            raise RuntimeError(f"platform process(es) exited during the run: {stack.dead()}")
        if time.monotonic() > deadline or time.monotonic() - last_progress > cfg.stall:
            timed_out = True
            progress(f"[{label}] drain timed out ({'no progress' if time.monotonic() < deadline else 'deadline'})")
            sender.stop()
            break
    drained_at = time.time()
    monitor.mark("end")
    steal1, busy1, client1 = procs.steal_seconds(), procs.busy_seconds(), time.process_time()
    otp.stop()
    sends = sorted(sender.records, key=lambda r: r["index"])
    otp_records = otp.records()
    event_ids = [i for r in sends for i in r["ids"].values()]
    otp_ids = [r["id"] for r in otp_records if r["id"]]
    progress(f"[{label}] drained; analysing {len(event_ids):,} notification ids at the emulator…")
    analysis = emulator.analysis(event_ids + otp_ids)
    last_otp = max((r["accept_ms"] for r in otp_records), default=0) / 1000
    while (sum(1 for i in otp_ids if i in analysis["received_at_ms"]) < len(set(otp_ids))
           and time.time() < max(last_otp, drained_at) + 35):
        time.sleep(2.0)
        analysis = emulator.analysis(event_ids + otp_ids)
    window = monitor.marks["end"][0] - monitor.marks["launch"][0]
    cpu = monitor.cpu_between("launch", "end")
    platform_seconds = sum(cpu.get(k, 0.0) for k in PLATFORM_KINDS)
    return {
        "run": event_report.summarize_events(
            launch_ms=launch_ms, end_ms=drained_at * 1000, sends=sends, statuses=_statuses(event_ids),
            received=analysis["received_at_ms"], by_provider=analysis.get("by_provider") or {},
            otp_records=otp_records, cpu=cpu, requested=cfg.events, send_time_boxed=send_time_boxed,
            client_cpu_seconds=round(client1 - client0, 2),
            rss=monitor.rss_between(monitor.marks["launch"][0], monitor.marks["end"][0]),
            platform_kinds=PLATFORM_KINDS, timed_out=timed_out),
        "content_checks": _content_checks(emulator, sends),
        "analysis_source": emulator.analysis_source,
        "machine_window": {"seconds": round(window, 1),
                           "steal_pct": round(100 * (steal1 - steal0) / max(1e-9, window * procs.cores()), 1),
                           "busy_pct": round(100 * (busy1 - busy0) / max(1e-9, window * procs.cores()), 1),
                           "platform_pct": round(100 * platform_seconds / max(1e-9, window * procs.cores()), 1)},
    }


def _active() -> bool:
    """Whether a notification of the bench type may still be sent (the warm-up's were sent before
    the blast; the status index keeps this cheap while 200,000 rows drain)."""
    with connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM notifications_notification WHERE notification_type_id = %s "
                    "AND status IN ('scheduled', 'queued', 'sending'))", [TYPE_KEY])
        return cur.fetchone()[0]


def _statuses(ids: list[str]) -> dict[str, dict[str, int]]:
    """``{channel: {status: count}}`` of the notifications ``ids``."""
    out: dict[str, dict[str, int]] = {}
    with connection.cursor() as cur:
        cur.execute("SELECT channel, status, count(*) FROM notifications_notification WHERE id = ANY(%s::uuid[]) "
                    "GROUP BY channel, status", [ids])
        for channel, status, count in cur.fetchall():
            out.setdefault(channel, {})[status] = count
    return out


def _content_checks(emulator: Emulator, sends: list[dict]) -> list[dict]:
    """The first, middle and last accepted events: what the emulator received for each channel
    against the templates rendered by hand (``first_name`` is ``U<index>``, bench/seed.py)."""
    accepted = [s for s in sends if s["status"] == 202]
    if not accepted:
        return []
    picks = {accepted[0]["index"]: accepted[0], accepted[len(accepted) // 2]["index"]: accepted[len(accepted) // 2],
             accepted[-1]["index"]: accepted[-1]}
    checks = []
    for index, send in list(picks.items())[:CONTENT_SAMPLES]:
        for channel, nid in send["ids"].items():
            r = emulator.http.get(f"{emulator.base}/_emulator/messages", params={"notification_id": nid}, timeout=30)
            r.raise_for_status()
            got = [(m["title"], m["body"]) for m in r.json()]
            want = expected_content(channel, index, f"U{index}")
            checks.append({"id": nid, "channel": channel, "index": index, "ok": bool(got) and got[0] == want,
                           "expected": list(want), "got": [list(g) for g in got[:1]]})
    return checks

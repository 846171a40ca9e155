"""``manage.py bench --webhooks``: a blast whose client has an endpoint subscribed to every event
(docs/PERFORMANCE.md, "Status webhooks").

The endpoint is made by the service the API uses (``notifications.webhooks.endpoints.create``) on a
local receiver process (:mod:`bench.webhook_receiver`), before the stack starts; the stack runs the
webhook worker as the Procfile does. ``--webhooks-receiver-down S`` closes the receiver for S seconds
once a third of the campaign reached the provider. After the drain the run waits until the receiver
has every delivery the outbox holds for the endpoint (:func:`settle`); :func:`collect` tallies them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests
from django.db.models import Count, Sum

from bench import stats
from bench.stack import ROOT, free_port, wait_until
from bench.webhook_receiver import tally
from campaigns.models import Campaign
from notifications.models import APIClient
from notifications.webhooks import endpoints
from notifications.webhooks.models import EVENTS, TEST_EVENT, WebhookDelivery

#: Give up waiting when nothing new arrived for this long and nothing is due soon.
STALL_SECONDS = 180.0


class WebhookBench:
    def __init__(self, client: APIClient, work_dir: Path, receiver_down: float = 0.0) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port, control = free_port(), free_port()
        self.control = f"http://127.0.0.1:{control}"
        self.endpoint = endpoints.create(client, f"http://127.0.0.1:{self.port}/hooks", list(EVENTS),
                                         description="bench receiver")
        secret = work_dir / "webhook-secret"
        secret.write_text(self.endpoint.secret)
        self.log = open(work_dir / "webhook-receiver.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.webhook_receiver", "--port", str(self.port),
                                      "--control-port", str(control), "--secret-file", str(secret)],
                                     cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._up, 20, message="webhook receiver")
        self.receiver_down = receiver_down
        self.down_at: float | None = None

    def _up(self) -> bool:
        try:
            return requests.get(self.control, timeout=2).ok
        except requests.RequestException:
            return False

    def state(self) -> dict:
        r = requests.get(self.control, timeout=60)
        r.raise_for_status()
        return r.json()

    def tick(self, sent: int, campaign_size: int, progress: Callable[[str], None], label: str) -> None:
        """Called by the blast's loop: the outage starts once a third of the campaign was sent."""
        if self.receiver_down > 0 and self.down_at is None and sent >= campaign_size / 3:
            requests.post(f"{self.control}/down", params={"seconds": self.receiver_down}, timeout=10).raise_for_status()
            self.down_at = time.time()
            progress(f"[{label}] webhook receiver down for {self.receiver_down:.0f} s (connections refused)")

    def expected(self) -> dict[str, str]:
        """``{webhook-id: event type}`` of every delivery the outbox holds for the endpoint."""
        rows = WebhookDelivery.objects.filter(endpoint=self.endpoint).exclude(event_type=TEST_EVENT)
        return {f"msg_{pk.hex}": event_type for pk, event_type in rows.values_list("id", "event_type")}

    def settle(self, campaign_id: str, timeout: float, progress: Callable[[str], None], label: str) -> dict:
        """Wait until the campaign is completed, no delivery of the endpoint is pending and the
        receiver has every one the outbox holds; or ``timeout``, or a stall of :data:`STALL_SECONDS`."""
        began = time.monotonic()
        last, last_change, next_report = -1, began, began + 10
        while True:  # cheap polls (Postgres is measured): the pending rows' index, the receiver's counts
            completed = Campaign.objects.filter(pk=campaign_id, status="completed").exists()
            pending = WebhookDelivery.objects.filter(endpoint=self.endpoint, state="pending").count()
            r = requests.get(f"{self.control}/summary", timeout=10)
            r.raise_for_status()
            got = r.json()["ids"]
            if completed and not pending:
                expected = self.expected()
                if set(expected) <= set(self.state()["received"]):
                    return {"seconds": round(time.monotonic() - began, 1), "timed_out": False}
            if got != last:
                last, last_change = got, time.monotonic()
            now = time.monotonic()
            if now >= next_report:
                next_report += 10
                progress(f"[{label}] webhooks: {got:,} received, {pending:,} pending, "
                         f"campaign {'completed' if completed else 'not completed'}")
            if now - began > timeout or now - last_change > STALL_SECONDS:
                progress(f"[{label}] webhooks did not all arrive ({'stall' if now - began <= timeout else 'timeout'})")
                return {"seconds": round(now - began, 1), "timed_out": True}
            time.sleep(1.0)

    def collect(self, settled: dict, cpu_seconds: dict[str, float], statuses: dict[str, int]) -> dict:
        """The tally, latency move → first arrival, the catch-up after an outage, the worker's CPU
        per delivered webhook, and the cross-check of ``notification.<status>`` against the rows."""
        expected, state = self.expected(), self.state()
        counts = tally(expected, state)
        arrivals = [state["received"][i] for i in expected if i in state["received"]]
        latencies = [first - at for _t, at, first, _n in arrivals if at is not None]
        states = dict(WebhookDelivery.objects.filter(endpoint=self.endpoint).exclude(event_type=TEST_EVENT)
                      .values("state").annotate(n=Count("id")).values_list("state", "n"))
        delivered = states.get("delivered", 0)
        outage = state["outages"][0] if state["outages"] else None
        catch_up = first_after = None
        if outage and outage["up_ms"] and arrivals:
            after = [first for _t, _a, first, _n in arrivals if first >= outage["up_ms"]]
            first_after = round((min(after) - outage["up_ms"]) / 1000, 1) if after else None
            if counts["lost"] == 0:
                catch_up = round((max(first for _t, _a, first, _n in arrivals) - outage["up_ms"]) / 1000, 1)
        rows_by_status = {s: n for s, n in statuses.items() if f"notification.{s}" in EVENTS}
        sent_by_type = counts["by_type"]
        return {
            "endpoint_events": len(EVENTS), "settle": settled, **counts, "deliveries_by_state": states,
            "attempts": WebhookDelivery.objects.filter(endpoint=self.endpoint).aggregate(n=Sum("attempts"))["n"] or 0,
            "cross_check": {s: {"rows": n, "deliveries": sent_by_type.get(f"notification.{s}", {}).get("expected", 0)}
                            for s, n in sorted(rows_by_status.items())},
            "worker_cpu_seconds": cpu_seconds.get("worker_webhooks"),
            "cpu_us_per_webhook": stats.cpu_us_per_message(cpu_seconds, ["worker_webhooks"], delivered),
            "latency_ms": stats.latency_summary(latencies) if latencies else None,
            "outage": {"seconds": self.receiver_down, **outage} if outage else None,
            "catch_up_seconds": catch_up, "first_after_return_seconds": first_after,
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def problems(block: dict | None) -> list[str]:
    """What makes a ``--webhooks`` run exit 1: a webhook lost, a bad signature, a row's move without
    its ``notification.<status>``, no ``campaign.completed``."""
    if not block:
        return []
    out = []
    if block["lost"]:
        out.append(f"{block['lost']} status webhook(s) never received (first: {block['lost_ids'][:3]})")
    if block["rejected"]:
        out.append(f"{block['rejected']} webhook(s) failed the receiver's signature check")
    for status, row in block["cross_check"].items():
        if row["rows"] > row["deliveries"]:
            out.append(f"{row['rows']} rows {status} but {row['deliveries']} notification.{status} deliveries")
    if block["by_type"].get("campaign.completed", {}).get("expected") != 1:
        out.append("no campaign.completed delivery in the outbox")
    return out


def cost(with_run: dict, without_run: dict | None, kinds: list[str]) -> dict:
    """Platform CPU-µs per notification with the webhooks and without (the same blast after it, measured
    over the same window: :attr:`bench.runner.RunConfig.min_window`)."""
    def per(run: dict | None) -> float | None:
        if not run:
            return None
        cpu = run["cpu"]
        return stats.cpu_us_per_message(cpu["seconds_by_kind"], [k for k in kinds if k in cpu["seconds_by_kind"]],
                                        cpu["notifications_counted"])

    def by_kind(run: dict | None) -> dict[str, float | None]:
        cpu = (run or {}).get("cpu") or {}
        return {k: stats.cpu_us_per_message(cpu["seconds_by_kind"], [k], cpu["notifications_counted"])
                for k in kinds if k in cpu.get("seconds_by_kind", {})}

    with_us, without_us = per(with_run), per(without_run)
    return {"platform_us_per_notification": with_us, "platform_us_per_notification_without_webhooks": without_us,
            "added_us_per_notification": round(with_us - without_us, 1) if with_us and without_us else None,
            "us_per_notification_by_kind": by_kind(with_run),
            "us_per_notification_by_kind_without_webhooks": by_kind(without_run)}


def summary_text(block: dict) -> str:
    lat = block.get("latency_ms") or {}
    c = block.get("cost") or {}
    lines = [f"status webhooks (one endpoint, all {block['endpoint_events']} events): expected {block['expected']:,}, "
             f"received {block['received']:,}, duplicates {block['duplicates']:,}, lost {block['lost']:,}, "
             f"rejected {block['rejected']}, attempts {block['attempts']:,}",
             f"  by type: { {t: r['expected'] for t, r in block['by_type'].items()} }; "
             f"rows vs deliveries: {block['cross_check']}",
             f"  webhook worker CPU-µs / delivered webhook: {block['cpu_us_per_webhook']}",
             f"  platform CPU-µs / notification: {c.get('platform_us_per_notification')} with webhooks, "
             f"{c.get('platform_us_per_notification_without_webhooks')} without "
             f"(+{c.get('added_us_per_notification')})",
             f"  latency move → received ms: p50 {lat.get('p50')}, p95 {lat.get('p95')}, p99 {lat.get('p99')}, "
             f"max {lat.get('max')}; settled {block['settle']['seconds']} s after the drain"]
    if block.get("outage"):
        lines.append(f"  receiver down {block['outage']['seconds']:.0f} s; first webhook received "
                     f"{block['first_after_return_seconds']} s, every webhook {block['catch_up_seconds']} s after it "
                     f"came back")
    return "\n".join(lines)

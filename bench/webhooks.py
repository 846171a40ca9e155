"""``manage.py bench_status_webhooks``: what status webhooks cost (docs/PERFORMANCE.md, "Status webhooks").

A 10 k campaign's rows (its client launched it) are moved to ``sent`` by the lifecycle in the send
path's batches of 500, three times: nobody has an endpoint; another client has one subscribed to
every event; the campaign's client has one subscribed to every event. Measured: this process's CPU
and the queries per batch (Postgres' own CPU is not in the figure). Then the webhook worker's code
delivers the 10 k ``notification.sent`` deliveries to a receiver in another process: CPU per
webhook of the delivering process (signing, the HTTP request, the rows it writes).
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from core import clock
from notifications import lifecycle
from notifications.models import APIClient, Notification, Status
from notifications.webhooks import delivery, endpoints, outbox
from notifications.webhooks.models import EVENTS, WebhookDelivery, WebhookEndpoint
from preferences.models import Recipient

BATCH = 500


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve(port_out) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    port_out.put(server.server_address[1])
    server.serve_forever()


def _rows(campaign_id, n: int) -> list[Notification]:
    prefix = uuid.uuid4().hex[:6]
    Recipient.objects.bulk_create([Recipient(user_id=f"wh-{prefix}-{i}", phone="+4915112345678") for i in range(n)],
                                  batch_size=5000)
    rows = [Notification(id=uuid.uuid4(), campaign_id=campaign_id, recipient_id=f"wh-{prefix}-{i}", channel="sms",
                         body="b", status=Status.SENDING, claims=1, attempts=1) for i in range(n)]
    Notification.objects.bulk_create(rows, batch_size=5000)
    return rows


def _move(rows: list[Notification]) -> dict:
    outbox.forget_subscriptions()
    outbox.subscribers("notification.sent")  # the per-process read, outside the figure
    cpu = 0.0
    queries = []
    for start in range(0, len(rows), BATCH):
        chunk = rows[start:start + BATCH]
        with transaction.atomic(), CaptureQueriesContext(connection) as seen:
            began = time.process_time()
            lifecycle.sent(clock.now(), "twilio", [n.pk for n in chunk], [1] * len(chunk),
                           [f"SM{i}" for i in range(len(chunk))], [""] * len(chunk))
            cpu += time.process_time() - began
        queries.append(len(seen.captured_queries))
    return {"rows": len(rows), "cpu_us_per_row": round(cpu / len(rows) * 1e6, 1),
            "queries_per_batch": max(queries)}


def run(n: int = 10_000) -> dict:
    from campaigns.models import Campaign, Segment

    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": True, "BATCH_SIZE": 500,
                         "BATCH_BUDGET_SECONDS": 3600.0}
    WebhookEndpoint.objects.all().delete()
    owner, _ = APIClient.objects.create_key(name=f"bench-wh-{uuid.uuid4().hex[:6]}")
    other, _ = APIClient.objects.create_key(name=f"bench-wh-other-{uuid.uuid4().hex[:6]}")
    segment = Segment.objects.create(segment_id=f"bench-wh-{uuid.uuid4().hex[:6]}", name="bench", client=owner)
    campaign = Campaign.objects.create(client=owner, segment=segment, channel="sms", body="x")
    result = {"none": _move(_rows(campaign.pk, n))}
    endpoints.create(other, "http://127.0.0.1:9/other", list(EVENTS))
    result["another_client_subscribed"] = _move(_rows(campaign.pk, n))
    ports: multiprocessing.Queue = multiprocessing.Queue()
    receiver = multiprocessing.Process(target=_serve, args=(ports,), daemon=True)
    receiver.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=10)}/hooks"
        mine = endpoints.create(owner, url, list(EVENTS))
        result["subscribed"] = _move(_rows(campaign.pk, n))
        pending = WebhookDelivery.objects.filter(endpoint=mine, state="pending").count()
        began, wall = time.process_time(), time.monotonic()
        while WebhookDelivery.objects.filter(endpoint=mine, state="pending").exists():
            delivery.deliver_endpoint(mine.pk)
        cpu, wall = time.process_time() - began, time.monotonic() - wall
        delivered = WebhookDelivery.objects.filter(endpoint=mine, state="delivered").count()
        result["delivery"] = {"deliveries": pending, "delivered": delivered,
                              "cpu_us_per_webhook": round(cpu / max(1, delivered) * 1e6, 1),
                              "per_second_one_thread": round(delivered / wall, 1)}
    finally:
        receiver.terminate()
        receiver.join()
    return result

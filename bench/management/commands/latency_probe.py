"""``manage.py latency_probe``: measure a running stack (``make run``) while it is otherwise idle.

Sends ``--count`` high-priority notifications one after another over HTTP, each to a fresh
recipient, and reports per notification **accept** (the wall time of ``POST /v1/notifications``,
ms) and **accept → provider** (from the 202 to the emulator's ``received_at_ms``: the time to hand
an OTP to the provider). Writes ``bench/results/latency-<UTC timestamp>.json`` and prints a
summary. Only for a stack whose providers are the local emulator.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from datetime import UTC, datetime

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench.output import results_dir, write_json
from core.api.scopes import Scope
from core.vocabulary import CHANNELS
from notifications.models import APIClient


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Command(BaseCommand):
    help = "Measure accept latency and accept-to-provider latency of high-priority sends on a running stack."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=50)
        parser.add_argument("--channel", choices=CHANNELS, default="sms")
        parser.add_argument("--api", default=f"http://127.0.0.1:{settings.PUBLIC_BASE_URL.rsplit(':', 1)[-1]}")
        parser.add_argument("--emulator", default=settings.EMULATOR_URL)
        parser.add_argument("--out", default=str(results_dir()))

    def handle(self, *args, count, channel, api, emulator, out, **options):
        _, key = APIClient.objects.create_key(name=f"latency-probe-{uuid.uuid4().hex[:6]}", allow_high=True,
                                              scopes=[Scope.SEND, Scope.RECIPIENTS_WRITE, Scope.DEVICES_WRITE,
                                                      Scope.READ])
        http = requests.Session()
        http.headers["Authorization"] = f"Api-Key {key}"
        try:
            http.get(f"{emulator}/_emulator/health", timeout=2).raise_for_status()
        except requests.RequestException as exc:
            raise CommandError(f"emulator not reachable at {emulator} (is `make run` running?): {exc}") from None
        accept_ms: list[float] = []
        handoff_ms: list[float] = []
        for i in range(count):
            uid = f"probe-{uuid.uuid4().hex[:10]}"
            http.put(f"{api}/v1/users/{uid}", json={"phone": f"+4915{i:09d}"[:14], "email": f"{uid}@example.com"},
                     timeout=5).raise_for_status()
            if channel == "push":
                http.put(f"{api}/v1/users/{uid}/devices", json={"platform": "android", "push_token": f"tok-{uid}"},
                         timeout=5).raise_for_status()
            content = {"body": "Your code is 123456"} if channel == "sms" else {"title": "Code", "body": "123456"}
            t0 = time.time()
            r = http.post(f"{api}/v1/notifications", json={"user_id": uid, "channel": channel, "priority": "high",
                                                           "content": content, "sensitive": True},
                          headers={"Idempotency-Key": uuid.uuid4().hex}, timeout=10)
            t1 = time.time()
            if r.status_code != 202:
                raise CommandError(f"send failed: {r.status_code} {r.text}")
            accept_ms.append((t1 - t0) * 1000)
            nid = r.json()["id"]
            deadline = time.time() + 10
            while time.time() < deadline:
                got = http.get(f"{emulator}/_emulator/messages", params={"notification_id": nid}, timeout=5).json()
                if got:
                    handoff_ms.append(got[0]["received_at_ms"] - t1 * 1000)
                    break
                time.sleep(0.005)
            else:
                raise CommandError(f"notification {nid} did not reach the emulator within 10 s")
        result = {
            "measured_at": datetime.now(UTC).isoformat(), "channel": channel, "count": count,
            "accept_ms": self._summary(accept_ms), "accept_to_provider_ms": self._summary(handoff_ms),
        }
        path = write_json("latency", result, out)
        self.stdout.write(json.dumps(result, indent=2))
        self.stdout.write(f"written to {path}")

    @staticmethod
    def _summary(values: list[float]) -> dict:
        return {"p50": round(statistics.median(values), 1), "p95": round(_pct(values, 95), 1),
                "p99": round(_pct(values, 99), 1), "max": round(max(values), 1),
                "mean": round(statistics.fmean(values), 1)}

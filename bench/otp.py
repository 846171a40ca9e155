"""High-priority sends through the HTTP API at a fixed rate, as an auth service sending OTPs would.

One scheduler thread fires a POST every ``1/rate`` seconds (on a fixed grid, so a slow answer does
not lower the rate) on a small pool of threads, each with its own keep-alive session. The accept
instant is the client's clock just before the POST; the latency the bench reports is the
emulator's receipt instant minus that.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

CONTENT = {"sms": {"body": "Your code is 123456"}, "email": {"title": "Your code", "body": "Your code is 123456"},
           "push": {"title": "Your code", "body": "Your code is 123456"}}


class OtpSender:
    def __init__(self, api: str, key: str, user_ids: list[str], channels: list[str], rate: float,
                 threads: int = 8, limit: int | None = None) -> None:
        self.api = api
        self.limit = limit  # stop scheduling after this many sends (None: until stop())
        self.key = key
        self.user_ids = user_ids
        self.channels = channels
        self.rate = rate
        self.sent: list[dict] = []  # every attempt: id (on 202), channel, accept_ms, status, api_ms
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-otp")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.rate <= 0:
            return
        self._thread = threading.Thread(target=self._schedule, name="bench-otp-scheduler", daemon=True)
        self._thread.start()

    def wait_scheduled(self, timeout: float) -> None:
        """Wait until the scheduler has fired its ``limit`` sends (or ``timeout``)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)

    def send_one(self, channel: str, user_id: str) -> dict:
        """POST one OTP now (also used for the warm-up); returns its record."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.headers["Authorization"] = f"Api-Key {self.key}"
        accept_ms = time.time() * 1000
        record = {"channel": channel, "accept_ms": accept_ms, "id": None, "status": None}
        try:
            r = session.post(f"{self.api}/v1/notifications", timeout=30,
                             headers={"Idempotency-Key": uuid.uuid4().hex},
                             json={"user_id": user_id, "channel": channel, "priority": "high",
                                   "content": CONTENT[channel], "sensitive": True})
            record["status"] = r.status_code
            if r.status_code == 202:
                record["id"] = r.json()["id"]
            else:
                record["error"] = r.text[:300]
        except requests.RequestException as exc:
            record["error"] = str(exc)[:300]
        record["api_ms"] = round(time.time() * 1000 - accept_ms, 1)
        return record

    def _fire(self, channel: str, user_id: str) -> None:
        record = self.send_one(channel, user_id)
        with self._lock:
            self.sent.append(record)

    def _schedule(self) -> None:
        users = itertools.cycle(self.user_ids)
        channels = itertools.cycle(self.channels)
        start = time.monotonic()
        for n in itertools.count():
            if self.limit is not None and n >= self.limit:
                return
            due = start + n / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            self._pool.submit(self._fire, next(channels), next(users))

    def records(self) -> list[dict]:
        with self._lock:
            return sorted(self.sent, key=lambda r: r["accept_ms"])

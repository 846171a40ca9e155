"""The event blast's client: a two-channel notification type, and ``POST /v1/events`` for a list of
users as fast as a bounded number of connections allows (docs/PERFORMANCE.md, "Event blast").

:class:`EventSender` is a closed loop: ``concurrency`` coroutines over one aiohttp session, each
sending its next event when its last is answered, so the load is what the API accepts (aiohttp, not
``requests``: cheaper client CPU on shared cores, docs/PERFORMANCE.md "Calibration"). Each event
carries a unique ``Idempotency-Key``; no answer, 5xx or 429 is retried with the same key, so a
retry never creates a second event.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence

import aiohttp

TYPE_KEY = "bench_order_shipped"
CHANNELS = ("push", "email")
#: Answers worth sending again with the same key (no answer at all is retried too).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def type_definition() -> dict:
    """``PUT /v1/notification-types/bench_order_shipped``: push + email, routing ``all``, templates
    using the event's data and the recipient's ``first_name`` attribute (bench/seed.py)."""
    return {
        "name": "Bench: order shipped", "category": "shipping", "priority": "standard",
        "channels": list(CHANNELS), "routing": "all", "quiet_hours": "defer", "required_data": ["order_id"],
        "templates": [
            {"channel": "push", "locale": "en", "title": "Order {{ data.order_id }} shipped",
             "body": "Hi {{ first_name }}, order {{ data.order_id }} is on its way",
             "data": {"url": "{{ data.tracking_url }}"}},
            {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }} shipped",
             "body": "Hi {{ first_name }}, track it: {{ data.tracking_url }}",
             "html": '<p>Hi {{ first_name }}, <a href="{{ data.tracking_url }}">track it</a></p>'},
        ],
    }


def event_data(index: int) -> dict:
    """The ``data`` of the ``index``-th event."""
    return {"order_id": f"B{index:07d}", "tracking_url": f"https://track.example/B{index:07d}"}


def expected_content(channel: str, index: int, first_name: str) -> tuple[str, str]:
    """``(title, body)`` the provider should receive for the ``index``-th event's ``channel``
    notification to a recipient whose ``first_name`` is given (the templates above, rendered)."""
    data = event_data(index)
    title = f"Order {data['order_id']} shipped"
    if channel == "push":
        return title, f"Hi {first_name}, order {data['order_id']} is on its way"
    return title, f"Hi {first_name}, track it: {data['tracking_url']}"


class EventSender:
    """Sends one event per user of ``user_ids`` (in order) to ``api`` with API key ``key``.

    ``records`` (filled as answers arrive, in completion order) holds one dict per event:
    ``index``, ``user_id``, ``start_ms`` (client clock just before the first attempt), ``end_ms``
    (after the last answer), ``status`` (the last HTTP status, ``None`` without an answer),
    ``attempts``, ``ids`` (``{channel: notification id}`` from the 202 body) and ``error``.
    """

    def __init__(self, api: str, key: str, user_ids: Sequence[str], concurrency: int = 8,
                 type_key: str = TYPE_KEY, max_attempts: int = 3, timeout_s: float = 60.0) -> None:
        self.api = api
        self.key = key
        self.user_ids = list(user_ids)
        self.concurrency = concurrency
        self.type_key = type_key
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.records: list[dict] = []
        self.run_id = uuid.uuid4().hex[:8]
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Send no new event (those in flight finish) and wait for the loop to end."""
        self._stop.set()
        self.join()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by the runner, never lost in a thread
            self.error = exc
        finally:
            self.done.set()

    async def _main(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        headers = {"Authorization": f"Api-Key {self.key}"}
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            pending = iter(enumerate(self.user_ids))  # shared by the coroutines of this one loop
            await asyncio.gather(*(self._worker(session, pending) for _ in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession, pending) -> None:
        for index, user_id in pending:
            if self._stop.is_set():
                return
            self.records.append(await self._send(session, index, user_id))

    async def _send(self, session: aiohttp.ClientSession, index: int, user_id: str) -> dict:
        record: dict = {"index": index, "user_id": user_id, "start_ms": time.time() * 1000, "status": None,
                        "attempts": 0, "ids": {}, "error": None}
        body = {"type": self.type_key, "user_id": user_id, "data": event_data(index)}
        headers = {"Idempotency-Key": f"bench-{self.run_id}-{index}"}
        for attempt in range(1, self.max_attempts + 1):
            record["attempts"] = attempt
            try:
                async with session.post(f"{self.api}/v1/events", json=body, headers=headers) as r:
                    record["status"] = r.status
                    if r.status == 202:
                        answer = await r.json()
                        record["ids"] = {n["channel"]: n["id"] for n in answer["notifications"]}
                        record["error"] = None
                        break
                    record["error"] = (await r.text())[:300]
                    if r.status not in RETRY_STATUSES:
                        break
            except (TimeoutError, aiohttp.ClientError) as exc:
                record["status"], record["error"] = None, f"{type(exc).__name__}: {exc}"[:300]
            if attempt < self.max_attempts:
                await asyncio.sleep(0.5 * attempt)
        record["end_ms"] = time.time() * 1000
        return record

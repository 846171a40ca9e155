"""Outgoing webhooks of the emulator: signed Twilio status callbacks and SendGrid Event Webhook batches.

Everything runs on the emulator's own event loop with one ``aiohttp.ClientSession`` (created on first
use, closed at shutdown); provider handlers only schedule a task and return. Per message, receipts go
out one after the other (the next once the previous POST succeeded or was given up), so by default a
receiver sees ``sent`` before ``delivered``. SendGrid events that become due in the same loop
iteration share one POST (at most :data:`MAX_BATCH` events), as SendGrid batches them.

A POST that fails (connection error, timeout or non-2xx) is retried after 0.5 s, 1 s and 2 s, then
dropped and counted. Redirects are not followed and no proxy is used. **Only loopback URLs are ever
contacted** (host ``127.0.0.1``, ``localhost`` or ``::1``); anything else is refused: recorded with
``attempt`` 0 and counted as ``refused`` and ``dropped``.

The app's receipts of simulated engagement (``engagement.py``: push ``opened``) are JSON POSTs to the
platform's ``/v1/notifications/{id}/receipts`` with an API key, retried and recorded the same way
(provider ``"app"``).

Every attempt is recorded (``GET /_emulator/webhooks``)::

    {"provider": "twilio"|"sendgrid"|"app", "url", "status_code": 200|null, "attempt": 1..4 (0 = refused),
     "sent_at_ms", "kind": "sent"|"delivered"|… (a SendGrid batch of mixed events: "processed,delivered"),
     "notification_id": str|null (null when a batch spans several), "notification_ids": [...],
     "events": n, "error": null|"ClientConnectorError"|"refused: non-loopback host"|…}
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from yarl import URL

from providers.emulator.signing import (
    SENDGRID_SIGNATURE_HEADER,
    SENDGRID_TIMESTAMP_HEADER,
    TWILIO_SIGNATURE_HEADER,
    EventWebhookSigner,
    twilio_signature,
)
from providers.emulator.store import now_ms

logger = logging.getLogger(__name__)

#: Hosts webhooks may be sent to. Nothing else is ever contacted.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: Waits before the 2nd, 3rd and 4th attempt of a failed POST.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)
#: Most events in one SendGrid Event Webhook POST.
MAX_BATCH = 100
#: Seconds one POST may take (connect + answer).
POST_TIMEOUT_S = 10.0
#: Concurrent webhook connections.
MAX_CONNECTIONS = 100
#: Attempt records kept in memory (oldest dropped first).
MAX_RECORDS = 100_000
REFUSED = "refused: non-loopback host"
COUNTERS = ("attempts", "succeeded", "failed_attempts", "retries", "dropped", "refused")

Builder = Callable[[], tuple[bytes, dict[str, str]]]


def is_loopback_url(url: str) -> bool:
    """True for an ``http``/``https`` URL whose host is 127.0.0.1, localhost or ::1."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_HOSTS


def _exact(url: str) -> URL:
    """``url`` sent byte for byte (yarl would normalise ``%2F``/``%7E``…, breaking Twilio signatures)."""
    if url.isascii() and not any(ch.isspace() or ord(ch) < 32 for ch in url):
        return URL(url, encoded=True)
    return URL(url)


class Webhooks:
    """Schedules, signs, sends, retries and records the emulator's webhooks.

    Args:
        enabled: ``False`` (``EMULATOR_RECEIPTS=0``) turns every receipt off.
        sendgrid_url: where SendGrid events go (``EMULATOR_SENDGRID_EVENTS_URL``); ``None`` = no events.
        signer: the Event Webhook key pair; a fresh one is generated when ``None``.
    """

    def __init__(self, enabled: bool = True, sendgrid_url: str | None = None,
                 signer: EventWebhookSigner | None = None) -> None:
        self.enabled = enabled
        self.sendgrid_url = sendgrid_url or None
        self.signer = signer or EventWebhookSigner.generate()
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()
        self._records: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDS)
        self._counts: Counter[str] = Counter()
        #: Events answered 2xx / given up, per ``"<provider>:<kind>"`` (a SendGrid batch counts each event).
        self._delivered: Counter[str] = Counter()
        self._lost: Counter[str] = Counter()
        self._batch: list[tuple[dict[str, Any], str, str | None, asyncio.Future]] = []
        self._flush_scheduled = False

    # --- scheduling (called from provider handlers; never blocks) --------------------------------

    def twilio(self, url: str, auth_token: str, callbacks: list[tuple[str, dict[str, str]]],
               delay_s: float, notification_id: str | None) -> None:
        """Send ``callbacks`` (``(kind, params)``) to ``url`` one by one, starting after ``delay_s``."""
        if not callbacks:
            return
        if not is_loopback_url(url):
            for kind, _ in callbacks:
                self._refuse("twilio", url, kind, [notification_id], 1)
            return
        self._spawn(self._twilio_flow(url, auth_token, callbacks, delay_s, notification_id))

    def sendgrid(self, events: list[dict[str, Any]], delay_s: float, notification_id: str | None) -> None:
        """Send one recipient's ``events`` to the events URL one by one (batched with others)."""
        if not events or not self.sendgrid_url:
            return
        if not is_loopback_url(self.sendgrid_url):
            for event in events:
                self._refuse("sendgrid", self.sendgrid_url, event["event"], [notification_id], 1)
            return
        self._spawn(self._sendgrid_flow(events, delay_s, notification_id))

    def app_receipt(self, base_url: str, api_key: str, notification_id: str, event: str, at: float,
                    delay_s: float) -> None:
        """POST the app's ``event`` (``opened``) at unix time ``at`` for ``notification_id`` to the
        platform's ``<base_url>/v1/notifications/<id>/receipts`` after ``delay_s``, with ``api_key``."""
        url = f"{base_url.rstrip('/')}/v1/notifications/{notification_id}/receipts"
        if not self.enabled:
            return
        if not is_loopback_url(url):
            self._refuse("app", url, event, [notification_id], 1)
            return
        stamp = datetime.fromtimestamp(at, tz=UTC).isoformat().replace("+00:00", "Z")
        body = json.dumps({"event": event, "at": stamp}).encode("utf-8")
        headers = {"Content-Type": "application/json", "Authorization": f"Api-Key {api_key}"}
        self._spawn(self._app_flow(url, event, notification_id, body, headers, delay_s))

    # --- inspection --------------------------------------------------------------------------------

    def records(self, provider: str | None = None, kind: str | None = None,
                notification_id: str | None = None) -> list[dict[str, Any]]:
        return [
            dict(r) for r in self._records
            if (provider is None or r["provider"] == provider)
            and (kind is None or kind in r["kind"].split(","))
            and (notification_id is None or notification_id in r["notification_ids"])
        ]

    def stats(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "sendgrid_events_url": self.sendgrid_url,
                "pending": len(self._tasks), **{k: self._counts[k] for k in COUNTERS},
                "events_delivered": dict(self._delivered), "events_dropped": dict(self._lost)}

    def clear(self) -> None:
        """Forget recorded attempts and zero the counters (deliveries in progress go on)."""
        self._records.clear()
        self._counts.clear()
        self._delivered.clear()
        self._lost.clear()

    async def close(self) -> None:
        """Cancel pending deliveries and close the HTTP session (at shutdown)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- flows -------------------------------------------------------------------------------------

    async def _twilio_flow(self, url: str, token: str, callbacks: list[tuple[str, dict[str, str]]],
                           delay_s: float, notification_id: str | None) -> None:
        await asyncio.sleep(delay_s)
        for kind, params in callbacks:
            body = urlencode(params).encode("utf-8")
            headers = {
                "Content-Type": "application/x-www-form-urlencoded",
                "User-Agent": "TwilioProxy/1.1",
                TWILIO_SIGNATURE_HEADER: twilio_signature(token, url, params),
            }
            ok = await self._deliver("twilio", url, kind, [notification_id], 1, lambda b=body, h=headers: (b, h))
            (self._delivered if ok else self._lost)[f"twilio:{kind}"] += 1

    async def _app_flow(self, url: str, event: str, notification_id: str, body: bytes, headers: dict[str, str],
                        delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        ok = await self._deliver("app", url, event, [notification_id], 1, lambda: (body, headers))
        (self._delivered if ok else self._lost)[f"app:{event}"] += 1

    async def _sendgrid_flow(self, events: list[dict[str, Any]], delay_s: float,
                             notification_id: str | None) -> None:
        await asyncio.sleep(delay_s)
        loop = asyncio.get_running_loop()
        for event in events:
            done = loop.create_future()
            self._batch.append((event, event["event"], notification_id, done))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
            await done

    def _flush(self) -> None:
        """Post the events queued in this loop iteration, :data:`MAX_BATCH` per request."""
        self._flush_scheduled = False
        pending, self._batch = self._batch, []
        for start in range(0, len(pending), MAX_BATCH):
            self._spawn(self._post_batch(pending[start:start + MAX_BATCH]))

    async def _post_batch(self, items: list[tuple[dict[str, Any], str, str | None, asyncio.Future]]) -> None:
        body = json.dumps([event for event, _, _, _ in items], ensure_ascii=False).encode("utf-8")
        kinds = ",".join(dict.fromkeys(kind for _, kind, _, _ in items))
        ids = [nid for _, _, nid, _ in items]

        def build() -> tuple[bytes, dict[str, str]]:
            timestamp = str(int(time.time()))
            return body, {
                "Content-Type": "application/json",
                "User-Agent": "SendGrid Event API",
                SENDGRID_SIGNATURE_HEADER: self.signer.sign(timestamp, body),
                SENDGRID_TIMESTAMP_HEADER: timestamp,
            }

        ok = False
        try:
            ok = await self._deliver("sendgrid", self.sendgrid_url or "", kinds, ids, len(items), build)
        finally:
            (self._delivered if ok else self._lost).update(f"sendgrid:{kind}" for _, kind, _, _ in items)
            for _, _, _, done in items:
                if not done.done():
                    done.set_result(None)

    # --- one POST with retries --------------------------------------------------------------------

    async def _deliver(self, provider: str, url: str, kind: str, notification_ids: list[str | None],
                       events: int, build: Builder) -> bool:
        session = self._get_session()
        for attempt in range(1, len(RETRY_DELAYS_S) + 2):
            if attempt > 1:
                self._counts["retries"] += 1
                await asyncio.sleep(RETRY_DELAYS_S[attempt - 2])
            body, headers = build()
            sent_at = now_ms()
            status: int | None = None
            error: str | None = None
            try:
                async with session.post(_exact(url), data=body, headers=headers, allow_redirects=False) as response:
                    status = response.status
                    await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = type(exc).__name__
            self._counts["attempts"] += 1
            ok = status is not None and 200 <= status < 300
            if status is not None and not ok:
                error = f"HTTP {status}"
            self._record(provider, url, status, attempt, sent_at, kind, notification_ids, events, error)
            if ok:
                self._counts["succeeded"] += 1
                return True
            self._counts["failed_attempts"] += 1
        self._counts["dropped"] += 1
        self._log_drop("%s webhook %s to %s dropped after %d attempts (%s)",
                       provider, kind, url, len(RETRY_DELAYS_S) + 1, error)
        return False

    # --- helpers -----------------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
                timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S),
                trust_env=False,
            )
        return self._session

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("webhook delivery failed", exc_info=task.exception())

    def _refuse(self, provider: str, url: str, kind: str, notification_ids: list[str | None],
                events: int) -> None:
        self._counts["refused"] += 1
        self._counts["dropped"] += 1
        self._record(provider, url, None, 0, now_ms(), kind, notification_ids, events, REFUSED)
        self._log_drop("%s webhook %s to %s refused: only 127.0.0.1, localhost and ::1 are contacted",
                       provider, kind, url)

    def _record(self, provider: str, url: str, status: int | None, attempt: int, sent_at: int, kind: str,
                notification_ids: list[str | None], events: int, error: str | None) -> None:
        ids = [nid for nid in dict.fromkeys(notification_ids) if nid is not None]
        self._records.append({
            "provider": provider, "url": url, "status_code": status, "attempt": attempt,
            "sent_at_ms": sent_at, "kind": kind,
            "notification_id": ids[0] if len(ids) == 1 else None, "notification_ids": ids,
            "events": events, "error": error,
        })

    def _log_drop(self, message: str, *args: Any) -> None:
        """Warn on the 1st, 10th, 100th… drop, then every 10 000th (a dead receiver must not flood)."""
        n = self._counts["dropped"]
        if n in (1, 10, 100, 1000) or n % 10_000 == 0:
            logger.warning(message + " [%d dropped so far]", *args, n)

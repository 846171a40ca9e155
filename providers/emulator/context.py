"""Shared state of one emulator process and the fault step every provider handler runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

from providers.emulator.clock import OffsetClock
from providers.emulator.engagement import Engagement
from providers.emulator.faults import Fault, FaultBook
from providers.emulator.receipts import ReceiptBook, sendgrid_open
from providers.emulator.store import MessageStore, Stats
from providers.emulator.webhooks import Webhooks


@dataclass
class Emulator:
    """Recorded messages, fault rules, counters and outgoing receipts, shared by the HTTP and SMTP sides."""

    store: MessageStore
    faults: FaultBook = field(default_factory=FaultBook)
    stats: Stats = field(default_factory=Stats)
    receipts: ReceiptBook = field(default_factory=ReceiptBook)
    webhooks: Webhooks = field(default_factory=Webhooks)
    #: The host's time plus the test clock offset (``CLOCK_OFFSET_FILE``): what events are stamped with.
    clock: OffsetClock = field(default_factory=OffsetClock)
    #: Simulated engagement (``engagement.py``); ``None``: nobody opens anything.
    engagement: Engagement | None = None

    def engage_email(self, email: str, message_key: str, events: list[dict], delay_s: float,
                     notification_id: str | None, delivered_at: float) -> None:
        """Post an ``open`` for a recipient whose ``events`` end delivered, if the model opens it."""
        delivered = next((e for e in events if e["event"] == "delivered"), None)
        if self.engagement is None or delivered is None or events[-1] is not delivered:
            return
        opened_at = self.engagement.opens(email, message_key, delivered_at)
        if opened_at is not None:
            self.webhooks.sendgrid([sendgrid_open(delivered, opened_at)],
                                   delay_s + self.engagement.delay_ms / 1000.0, notification_id)

    def engage_push(self, token: str, notification_id: str | None, delivered_at: float) -> None:
        """Post the app's ``opened`` for a push the model opens (needs its ``app_receipts_url``)."""
        model = self.engagement
        if model is None or model.app_receipts_url is None or model.app_receipts_key is None or not notification_id:
            return
        opened_at = model.opens(token, notification_id, delivered_at)
        if opened_at is not None:
            self.webhooks.app_receipt(model.app_receipts_url, model.app_receipts_key, notification_id, "opened",
                                      opened_at, model.delay_ms / 1000.0)

    async def fault_for(
        self, provider: str, destinations: Iterable[str], smtp_phase: str | None = None,
        account: str | None = None,
    ) -> Fault | None:
        """Apply the first matching fault rule: sleep its latency, return it if it is an error.

        ``account``: Twilio AccountSid or FCM project id of the request (see ``FaultBook.match``).
        Returns ``None`` when no rule fired or the rule only adds latency (slow success).
        """
        fault = self.faults.match(provider, destinations, smtp_phase, account)
        if fault is None:
            return None
        if fault.latency_s > 0:
            await asyncio.sleep(fault.latency_s)
        if fault.status is None and fault.code is None:
            return None
        return fault


EMULATOR_KEY = web.AppKey("emulator", Emulator)


def emulator_of(request: web.Request) -> Emulator:
    return request.app[EMULATOR_KEY]


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None

"""Shared state of one emulator process and the fault step every provider handler runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

from providers.emulator.faults import Fault, FaultBook
from providers.emulator.receipts import ReceiptBook
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

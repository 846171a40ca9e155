"""The emulator's control API as the bench uses it: fault rules, counts and the analysis of what
it received.

``POST /_emulator/analysis`` answers for a list of notification ids (see :meth:`Emulator.analysis`);
an emulator without that endpoint is analysed from ``GET /_emulator/messages`` instead
(:func:`bench.stats.analyze_messages`), and the report says which was used.
"""

from __future__ import annotations

from collections.abc import Sequence

import requests

from bench.stats import analyze_messages

PRIMARY_SMS_ACCOUNT = "AC" + "0" * 32
BACKUP_SMS_ACCOUNT = "AC" + "1" * 32
PROVIDER_OF_CHANNEL = {"email": "sendgrid", "sms": "twilio", "push": "fcm"}


class Emulator:
    def __init__(self, base: str) -> None:
        self.base = base
        self.http = requests.Session()
        self.analysis_source = "endpoint"

    def add_fault(self, **rule) -> dict:
        r = self.http.post(f"{self.base}/_emulator/faults", json=rule, timeout=10)
        if r.status_code >= 400:
            raise RuntimeError(f"emulator refused fault rule {rule}: {r.status_code} {r.text}")
        return r.json()

    def clear(self) -> None:
        """Forget messages, counters and fault rules."""
        for path in ("messages", "stats", "faults"):
            self.http.delete(f"{self.base}/_emulator/{path}", timeout=30).raise_for_status()

    def count(self, provider: str | None = None) -> int:
        params = {"provider": provider} if provider else {}
        r = self.http.get(f"{self.base}/_emulator/messages/count", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["count"]

    def stats(self) -> dict:
        r = self.http.get(f"{self.base}/_emulator/stats", timeout=10)
        r.raise_for_status()
        return r.json()

    def analysis(self, notification_ids: Sequence[str] = (), bucket_ms: int = 1000) -> dict:
        """Summary of every message in the emulator's memory; ``received_at_ms`` only for
        ``notification_ids`` (see ``POST /_emulator/analysis``)."""
        ids = [str(i) for i in notification_ids]
        if self.analysis_source == "endpoint":
            r = self.http.post(f"{self.base}/_emulator/analysis", timeout=600,
                               json={"notification_ids": ids, "bucket_ms": bucket_ms})
            if r.status_code not in (404, 405):
                r.raise_for_status()
                return r.json()
            self.analysis_source = "message list (no /_emulator/analysis)"
        r = self.http.get(f"{self.base}/_emulator/messages", timeout=600)
        r.raise_for_status()
        return analyze_messages(r.json(), ids, bucket_ms)


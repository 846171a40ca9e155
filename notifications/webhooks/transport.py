"""Webhook requests (docs/WEBHOOKS.md, "Safety"): the URL checked, the name resolved and every
address checked when a delivery run opens its :class:`Connection`, the connection made to the
checked address (TLS still verified against the name), no redirect followed, at most
``WEBHOOKS["MAX_RESPONSE_BYTES"]`` of an answer read, one timeout for connect and answer together.
urllib3 does the HTTP; this module only pins the address."""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings

from notifications.webhooks.safety import Refused, check_url, resolve


@dataclass(frozen=True)
class Answer:
    """What the endpoint answered: ``status`` None when no HTTP answer came (``error`` says why)."""

    status: int | None
    latency_ms: int
    retry_after: str = ""
    error: str = ""


class Connection:
    """Requests to one endpoint URL for one delivery run: the URL checked and its name resolved and
    checked once, then one kept-alive connection to that address (a run lasts at most its budget)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.timeout = timeout
        self.refused = ""
        self.pool: urllib3.HTTPConnectionPool | None = None
        try:
            scheme, host, port = check_url(url)
            address = resolve(host, port)
        except Refused as exc:
            self.refused = f"refused: {exc}"
            return
        parts = urlsplit(url)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if scheme == "https" else 80
        self.headers = {"Host": host if port == default else f"{host}:{port}", "Content-Type": "application/json",
                        "User-Agent": "notify-webhooks/1"}
        limit = urllib3.Timeout(total=timeout)
        if scheme == "https":
            self.pool = urllib3.HTTPSConnectionPool(
                address, port, timeout=limit, retries=False, cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                server_hostname=host, assert_hostname=host, maxsize=1)
        else:
            self.pool = urllib3.HTTPConnectionPool(address, port, timeout=limit, retries=False, maxsize=1)

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body``; never raises for the endpoint's behaviour."""
        started = time.monotonic()

        def took() -> int:
            return int((time.monotonic() - started) * 1000)

        if self.pool is None:
            return Answer(None, took(), error=self.refused)
        try:
            response = self.pool.urlopen("POST", self.path, body=body, headers={**headers, **self.headers},
                                         redirect=False, retries=False, preload_content=False,
                                         assert_same_host=False)
            response.read(settings.WEBHOOKS["MAX_RESPONSE_BYTES"])  # the rest is never read
            if response.length_remaining == 0:
                response.release_conn()  # read to its end: the connection serves the next request
            else:
                response.close()  # more than the cap, or no length: never reused
            return Answer(response.status, took(), retry_after=response.headers.get("Retry-After", ""))
        except urllib3.exceptions.TimeoutError:
            return Answer(None, took(), error=f"timed out after {self.timeout:g} s")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Answer(None, took(), error=f"connection failed: {type(exc).__name__}: {str(exc)[:200]}")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

"""One webhook request (docs/WEBHOOKS.md, "Safety"): the URL checked, the name resolved and the
address checked, the connection made to that address (TLS still verified against the name), no
redirect followed, at most ``WEBHOOKS["MAX_RESPONSE_BYTES"]`` of the answer read, one timeout for
connect and answer together. urllib3 does the HTTP; this module only pins the address."""

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


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST ``body`` to ``url`` under the safety rules; never raises for the endpoint's behaviour."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        scheme, host, port = check_url(url)
        address = resolve(host, port)
    except Refused as exc:
        return Answer(None, took(), error=f"refused: {exc}")
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default = 443 if scheme == "https" else 80
    wire_headers = {**headers, "Host": host if port == default else f"{host}:{port}",
                    "Content-Type": "application/json", "User-Agent": "notify-webhooks/1"}
    limit = urllib3.Timeout(total=timeout)
    if scheme == "https":
        pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
            address, port, timeout=limit, retries=False, cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
            server_hostname=host, assert_hostname=host, maxsize=1)
    else:
        pool = urllib3.HTTPConnectionPool(address, port, timeout=limit, retries=False, maxsize=1)
    try:
        response = pool.urlopen("POST", path, body=body, headers=wire_headers, redirect=False, retries=False,
                                preload_content=False, assert_same_host=False)
        try:
            response.read(settings.WEBHOOKS["MAX_RESPONSE_BYTES"])  # the rest is never read
        finally:
            response.release_conn()
        return Answer(response.status, took(), retry_after=response.headers.get("Retry-After", ""))
    except urllib3.exceptions.TimeoutError:
        return Answer(None, took(), error=f"timed out after {timeout:g} s")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return Answer(None, took(), error=f"connection failed: {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        pool.close()

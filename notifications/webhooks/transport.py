"""Webhook requests (docs/WEBHOOKS.md, "Safety"): the URL checked, the name resolved and every
address checked when a delivery run opens its :class:`Connection`, the connection made to the
checked address (TLS still verified against the name), no redirect followed, at most
``WEBHOOKS["MAX_RESPONSE_BYTES"]`` of an answer read, and one wall-clock deadline for the whole
request: connect, TLS, headers and body. urllib3 does the HTTP; this module pins the address and
cuts the socket at the deadline (urllib3's timeouts bound each socket operation, so an endpoint
dripping its answer a byte at a time would otherwise hold the request for as long as it likes)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.client import HTTPException
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util.ssl_ import create_urllib3_context

from notifications.webhooks.safety import Refused, ResolveTimeout, check_url, resolve


@dataclass(frozen=True)
class Answer:
    """What the endpoint answered: ``status`` None when no HTTP answer came (``error`` says why)."""

    status: int | None
    latency_ms: int
    retry_after: str = ""
    error: str = ""


class _WatchedTLSSocket(ssl.SSLSocket):
    """An ``SSLSocket`` that tells its context's ``watch`` callback about itself before its handshake,
    so the deadline can cut a handshake dripped by the endpoint (the plain socket is detached by then)."""

    def do_handshake(self, block: bool = False) -> None:
        getattr(self.context, "watch", lambda _sock: None)(self)
        super().do_handshake(block)


class _Deadline:
    """Shuts the request's sockets down when it is not done ``seconds`` after it began: a blocked
    read or handshake then ends at once (``fired`` tells the caller it was the deadline)."""

    def __init__(self, seconds: float, sockets) -> None:
        self.sockets = sockets
        self.fired = False
        self.armed = True
        self.lock = threading.Lock()
        self.timer = threading.Timer(seconds, self._cut)
        self.timer.daemon = True

    def _cut(self) -> None:
        with self.lock:
            if not self.armed:
                return
            self.fired = True
            for sock in self.sockets():
                with contextlib.suppress(OSError):  # closed already
                    # the socket's own shutdown (an SSLSocket's would unwrap TLS under the reader)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def __enter__(self) -> _Deadline:
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:  # after this the timer touches no socket: the caller may close and reuse them
            self.armed = False
        self.timer.cancel()


class Connection:
    """Requests to one endpoint URL for one delivery run: the URL checked once, its name resolved and
    every address checked at each connect, within that request's deadline (a slow resolver is a
    timeout like a slow endpoint), then one kept-alive connection to that address."""

    def __init__(self, url: str, timeout: float) -> None:
        self.timeout = timeout
        self.refused = ""
        self.conn: HTTPConnection | None = None
        self.tls_socket: ssl.SSLSocket | None = None
        try:
            self.scheme, self.host, self.port = check_url(url)
        except Refused as exc:
            self.refused = f"refused: {exc}"
            return
        parts = urlsplit(url)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if self.scheme == "https" else 80
        self.headers = {"Host": self.host if self.port == default else f"{self.host}:{self.port}",
                        "Content-Type": "application/json", "User-Agent": "notify-webhooks/1"}
        if self.scheme == "https":
            self.context = create_urllib3_context()
            self.context.sslsocket_class = _WatchedTLSSocket
            self.context.watch = self._watch  # type: ignore[attr-defined]

    def _watch(self, sock: ssl.SSLSocket) -> None:
        self.tls_socket = sock

    def _sockets(self) -> list:
        return [s for s in (self.conn.sock if self.conn else None, self.tls_socket) if s is not None]

    def _connection(self, seconds_left: float) -> HTTPConnection:
        """The kept-alive connection, or a new one when there is none or the endpoint closed it: the
        name resolved within ``seconds_left`` and every address checked (:func:`resolve`), the
        connection made to the checked address."""
        if self.conn is not None and not self.conn.is_connected:
            self._drop()
        if self.conn is None:
            address = resolve(self.host, self.port, timeout=seconds_left)
            if self.scheme == "https":
                self.conn = HTTPSConnection(address, self.port, timeout=self.timeout, ssl_context=self.context,
                                            cert_reqs="CERT_REQUIRED", ca_certs=certifi.where(),
                                            server_hostname=self.host, assert_hostname=self.host)
            else:
                self.conn = HTTPConnection(address, self.port, timeout=self.timeout)
        return self.conn

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body`` within the timeout (the whole request); never raises for the endpoint's behaviour."""
        started = time.monotonic()

        def took() -> int:
            return int((time.monotonic() - started) * 1000)

        if self.refused:
            return Answer(None, took(), error=self.refused)
        answer: Answer | None = None
        keep = False
        failure: BaseException | None = None
        with _Deadline(self.timeout, self._sockets) as deadline:
            try:
                conn = self._connection(self.timeout - (time.monotonic() - started))
                conn.request("POST", self.path, body=body, headers={**headers, **self.headers},
                             preload_content=False, decode_content=False)
                response = conn.getresponse()
                response.read(settings.WEBHOOKS["MAX_RESPONSE_BYTES"])  # the rest is never read
                keep = response.length_remaining == 0  # read to its end: the connection serves the next
                answer = Answer(response.status, took(), retry_after=response.headers.get("Retry-After", ""))
            except ResolveTimeout as exc:
                return Answer(None, took(), error=f"timed out after {self.timeout:g} s: {exc}")
            except Refused as exc:
                return Answer(None, took(), error=f"refused: {exc}")
            except (urllib3.exceptions.HTTPError, HTTPException, OSError, ValueError) as exc:
                failure = exc
        self.tls_socket = None
        if deadline.fired or isinstance(failure, (urllib3.exceptions.TimeoutError, TimeoutError)):
            self._drop()
            return Answer(None, took(), error=f"timed out after {self.timeout:g} s")
        if not keep:
            self._drop()  # more than the cap, no length, or a failure: never reused
        if answer is None:
            return Answer(None, took(), error=f"connection failed: {type(failure).__name__}: {str(failure)[:200]}")
        return answer

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self._drop()

"""The pooled httpx client ``send_each_async`` posts through (installed by providers/fcm/sdk_hooks.py).

What it changes against the SDK's own ``HttpxAsyncClient`` (docs/PROVIDERS.md, "Async SDK paths"):

* no retries: a plain ``httpx.AsyncHTTPTransport(retries=0)`` instead of firebase-admin's
  ``HttpxRetryTransport`` (which re-sends a 500/503 four times inside one call);
* explicit timeouts: ``httpx.Timeout(connect=, read=, write=read)`` and a total deadline per request
  (``asyncio.timeout``), which httpx lacks; an expired deadline is raised as
  ``httpx.TimeoutException`` so the SDK maps it to ``DeadlineExceededError`` like a read timeout;
* bounded concurrency: the semaphore of the current batch (:data:`batch_gate`) is held around
  each request, since ``send_each_async`` gathers all its (≤ 500) requests at once;
* one connection pool (``httpx.Limits``) per backend instance, reused across batches.

HTTP/2 (``http2=True``, as the SDK) is negotiated by ALPN over TLS only; to the plain-HTTP emulator
httpx speaks HTTP/1.1, which is what the emulator serves.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import aiohttp
import google.auth.transport.requests
import httpx

from providers.base import CallTimeouts

# httpx logs every request at INFO (one formatted line per push: a good share of the client CPU of
# a batch); its warnings stay.
if logging.getLogger("httpx").level == logging.NOTSET:
    logging.getLogger("httpx").setLevel(logging.WARNING)

#: The semaphore of the batch the current task belongs to (set before ``send_each_async``; the
#: tasks it gathers copy the context, so each of its requests sees its own batch's gate).
batch_gate: contextvars.ContextVar[asyncio.Semaphore | None] = contextvars.ContextVar("fcm_batch_gate",
                                                                                      default=None)


class SdkCallError(httpx.HTTPError):
    """Something other than an httpx error escaped a request (e.g. google-auth failing to refresh
    the token after a 401). Raised as an ``httpx.HTTPError`` so ``send_each_async`` turns it into
    that message's error instead of failing the whole gather; the original is ``__cause__``."""


class GoogleBearerAuth(httpx.Auth):
    """httpx auth flow adding ``credential``'s OAuth bearer token, as firebase-admin's
    ``GoogleAuthCredentialFlow`` does (refresh when missing or expiring, and up to two forced
    refreshes on a 401, re-sending the refused request), but with one google-auth transport
    ``Request`` reused for every request: the SDK's flow builds a new ``requests.Session`` per
    request, measured at about 1 ms of CPU per push (docs/PROVIDERS.md, "Async SDK paths").

    google-auth is synchronous: a refresh here blocks the event loop for one token request. It
    happens only on a 401, since the backend refreshes an expiring token before each batch on an
    executor thread.
    """

    MAX_REFRESHES = 2

    def __init__(self, credential: Any) -> None:
        self._credential = credential
        self._token_request = google.auth.transport.requests.Request()

    def auth_flow(self, request: httpx.Request):
        self._credential.before_request(self._token_request, request.method, str(request.url), request.headers)
        response = yield request
        for _ in range(self.MAX_REFRESHES):
            if response.status_code != 401:
                return
            self._credential.refresh(self._token_request)
            self._credential.apply(request.headers)
            response = yield request


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends through one pooled ``aiohttp.ClientSession`` (HTTP/1.1
    keep-alive), the HTTP stack the Twilio backend uses too.

    Why: httpcore (httpx's own transport) costs about 2 ms of client CPU per push request on this
    machine (its pool scans every connection per request), aiohttp a fraction of that
    (docs/PROVIDERS.md, "Async SDK paths"). aiohttp errors become the httpx errors the SDK and
    ``providers.base.transport_code`` expect: a timeout ``httpx.ReadTimeout`` (``ConnectTimeout``
    while connecting), a connection closed or reset after the request was sent
    ``httpx.RemoteProtocolError`` / ``httpx.ReadError``, a refused connection ``httpx.ConnectError``.
    The session is created on first use, on the loop the request runs on.
    """

    def __init__(self, timeouts: CallTimeouts, pool_size: int) -> None:
        self._timeouts = timeouts
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size),
                timeout=aiohttp.ClientTimeout(total=self._timeouts.total, sock_connect=self._timeouts.connect,
                                              sock_read=self._timeouts.read),
                auto_decompress=True, trust_env=False,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in ("host", "content-length")]
        try:
            async with self._open().request(request.method, str(request.url), headers=headers,
                                            data=request.content, allow_redirects=False) as answer:
                content = await answer.read()
                status, raw_headers = answer.status, [(k.decode("latin-1"), v.decode("latin-1"))
                                                      for k, v in answer.raw_headers]
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(f"{type(exc).__name__}: {exc}", request=request) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"{type(exc).__name__}: {exc}", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}", request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc
        raw_headers = [(k, v) for k, v in raw_headers if k.lower() not in ("content-encoding", "transfer-encoding")]
        return httpx.Response(status, headers=raw_headers, content=content, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class PooledFcmClient:
    """Stands in for firebase-admin's ``HttpxAsyncClient`` on one app's messaging service.

    Args:
        auth: the httpx auth flow (:class:`GoogleBearerAuth`).
        timeouts: connect, read and total seconds.
        pool_size: connections kept at most.
        http2: ``True``: httpx's own transport (httpcore), offering HTTP/2 (negotiated over TLS
            only), no retries; ``False`` (the backend's default): :class:`AiohttpTransport`, HTTP/1.1.
    """

    def __init__(self, auth: httpx.Auth, timeouts: CallTimeouts, pool_size: int, http2: bool = True) -> None:
        self.timeouts = timeouts
        limits = httpx.Limits(max_connections=pool_size, max_keepalive_connections=pool_size)
        self.transport: httpx.AsyncBaseTransport = (
            httpx.AsyncHTTPTransport(retries=0, http2=True, limits=limits) if http2
            else AiohttpTransport(timeouts, pool_size))
        self._client = httpx.AsyncClient(
            auth=auth, transport=self.transport, limits=limits, http2=http2,
            timeout=httpx.Timeout(connect=timeouts.connect, read=timeouts.read, write=timeouts.read,
                                  pool=timeouts.total),
        )
        self.closed = False

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request; the answer if 2xx.

        Raises:
            httpx.HTTPStatusError: a non-2xx answer (the SDK reads the FCM error from it).
            httpx.TimeoutException: no answer within the timeouts or the total deadline.
            httpx.HTTPError: any other failure (:class:`SdkCallError` wraps non-httpx ones).
        """
        gate = batch_gate.get()
        if gate is not None:
            await gate.acquire()
        try:
            async with asyncio.timeout(self.timeouts.total):
                response = await self._client.request(method, url, **kwargs)
        except TimeoutError as exc:
            raise httpx.TimeoutException(f"no answer within {self.timeouts.total} s") from exc
        except httpx.HTTPError:
            raise
        except Exception as exc:
            raise SdkCallError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            if gate is not None:
                gate.release()
        return response.raise_for_status()

    async def aclose(self) -> None:
        """Close the pool. Idempotent; after the first call a no-op on any loop (firebase-admin's
        ``delete_app`` calls it again through ``asyncio.run``)."""
        if not self.closed:
            self.closed = True
            await self._client.aclose()

"""The pooled client ``send_each_async`` posts through (installed by providers/fcm/sdk_hooks.py).

It replaces firebase-admin's ``HttpxAsyncClient``: no retries (the SDK's transport re-sends a
500/503 four times; here one message is one request, plus google-auth's resend on a 401), one pooled
``aiohttp.ClientSession`` per backend instance reused across batches (cheaper per push than httpx),
explicit timeouts; the caller bounds concurrency. Answers of 400 and up and transport failures are
raised as the httpx errors the SDK's mapping expects, so ``providers.base.transport_code`` reads
them as before. Why and the measurements: docs/PROVIDERS.md, "Async SDK paths".
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import google.auth.transport.requests
import httpx

from providers.base import CallTimeouts


class SdkCallError(httpx.HTTPError):
    """Something other than an HTTP error escaped a request (e.g. google-auth failing to refresh
    the token after a 401). Raised as an ``httpx.HTTPError`` so ``send_each_async`` turns it into
    that message's error instead of failing the whole gather; the original is ``__cause__``."""


class _JsonAnswer:
    """A 2xx answer: all ``send_each_async`` reads of it is ``json()``."""

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class PooledFcmClient:
    """Stands in for firebase-admin's ``HttpxAsyncClient`` on one app's messaging service.

    Args:
        credential: the app's google-auth credential; its bearer token is added to each request
            (refreshed by google-auth when missing or expiring, and up to :data:`MAX_REFRESHES`
            times on a 401, re-sending the refused request, as firebase-admin's
            ``GoogleAuthCredentialFlow`` does). google-auth is synchronous: a refresh here blocks
            the loop for one token request; the backend refreshes an expiring token before each
            batch on an executor thread, so this happens on a 401 only. One google-auth transport
            ``Request`` is reused (the SDK's flow builds a ``requests.Session`` per request).
        timeouts: connect, read and total seconds.
        pool_size: connections kept at most.
    """

    MAX_REFRESHES = 2

    def __init__(self, credential: Any, timeouts: CallTimeouts, pool_size: int) -> None:
        self.timeouts = timeouts
        self._credential = credential
        self._token_request = google.auth.transport.requests.Request()
        self._pool_size = pool_size
        self.session: aiohttp.ClientSession | None = None
        self.closed = False
        self._auth: tuple[Any, str, dict] | None = None  # (token, url, headers) of the last before_request

    def _open(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size),
                timeout=aiohttp.ClientTimeout(total=self.timeouts.total, sock_connect=self.timeouts.connect,
                                              sock_read=self.timeouts.read),
                trust_env=False,
            )
        return self.session

    async def request(self, method: str, url: str, **kwargs: Any) -> _JsonAnswer:
        """One request (``json=`` or ``content=`` body, ``headers=``); the answer if below 400.

        Raises:
            httpx.HTTPStatusError: an answer of 400 or more (the SDK reads the FCM error from it).
            httpx.TimeoutException: no answer within the timeouts.
            httpx.HTTPError: any other failure (:class:`SdkCallError` wraps non-HTTP ones).
        """
        status, headers, content = await self._send(method.upper(), url, kwargs)
        if status >= 400:
            request = httpx.Request(method.upper(), url)
            response = httpx.Response(status, headers=headers, content=content, request=request)
            raise httpx.HTTPStatusError(f"FCM answered {status}", request=request, response=response)
        return _JsonAnswer(status, content)

    async def _send(self, method: str, url: str, kwargs: dict) -> tuple[int, list[tuple[str, str]], bytes]:
        body = json.dumps(kwargs["json"]).encode() if "json" in kwargs else kwargs.get("content")
        base = {**(kwargs.get("headers") or {}), "Content-Type": "application/json"}
        try:
            for attempt in range(self.MAX_REFRESHES + 1):
                headers = {**base, **self._auth_headers(method, url)}
                async with self._open().request(method, url, data=body, headers=headers,
                                                allow_redirects=False) as answer:
                    content = await answer.read()
                    status = answer.status
                    answer_headers = [(k, v) for k, v in answer.headers.items()
                                      if k.lower() not in ("content-encoding", "transfer-encoding")]
                if status != 401 or attempt == self.MAX_REFRESHES:
                    return status, answer_headers, content
                self._credential.refresh(self._token_request)
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"{self.timeouts.expired(exc)} ({type(exc).__name__})") from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise SdkCallError(f"{type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _auth_headers(self, method: str, url: str) -> dict:
        """google-auth's headers for a request to ``url`` (``Credentials.before_request``: the
        bearer token, a quota project…), computed once per token and URL and reused while the
        credential stays valid: ``before_request`` refreshes an expired token and also runs
        google-auth's regional-access-boundary bookkeeping, about 4 % of a push worker's CPU when
        called for every push. A refresh (a 401, an expired token) gives a new token, so new headers."""
        credential = self._credential
        cached = self._auth
        if cached is not None and credential.valid and cached[0] == credential.token and cached[1] == url:
            return cached[2]
        headers: dict = {}
        credential.before_request(self._token_request, method, url, headers)
        self._auth = (credential.token, url, headers)
        return headers

    async def aclose(self) -> None:
        """Close the pool. Idempotent; after the first call a no-op on any loop (firebase-admin's
        ``delete_app`` calls it again through ``asyncio.run``)."""
        if not self.closed:
            self.closed = True
            if self.session is not None:
                await self.session.close()

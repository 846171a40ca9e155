"""The Twilio SDK's HTTP clients, pointed at ``BASE_URL`` (docs/PROVIDERS.md §1(a), option B), with
explicit timeouts and no retries: the synchronous one (the message-list lookup) and the async one
(every send), used by :class:`providers.twilio.backend.TwilioSmsBackend`."""

from __future__ import annotations

import contextvars
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.http.http_client import TwilioHttpClient
from twilio.http.response import Response

from providers.base import DEFAULT_POOL_SIZE, CallTimeouts

__all__ = ["AsyncRedirectingHttpClient", "RedirectingHttpClient", "last_response"]

#: The answer of the request the current task made last (each message's coroutine is its own task,
#: so concurrent creates never see each other's): ``TwilioRestException`` carries no headers, and
#: ``Retry-After`` is read from here.
_last_response: contextvars.ContextVar[Response | None] = contextvars.ContextVar("twilio_last_response",
                                                                               default=None)


class RedirectingHttpClient(TwilioHttpClient):
    """``TwilioHttpClient`` that sends every request to ``base_url`` (scheme + host[:port]) instead.

    Path and query are kept, so every Twilio domain works. With ``base_url=None`` nothing is
    rewritten (real Twilio). The requests session ignores proxy/netrc environment variables
    (``trust_env=False``). The last response is kept in ``last_response`` so the backend can read
    ``Retry-After`` after an error (``TwilioRestException`` does not carry headers). The SDK's
    ~10 INFO log lines per request are reduced to one DEBUG line each way.
    """

    def __init__(self, base_url: str | None, timeout: float) -> None:
        super().__init__(timeout=timeout)
        if self.session is not None:
            self.session.trust_env = False
        self._target = urlsplit(base_url) if base_url else None
        self.last_response: Response | None = None

    def request(
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,
        allow_redirects: bool = False,
    ) -> Response:
        """Same contract as ``TwilioHttpClient.request``; only scheme and host are swapped."""
        if self._target is not None:
            parts = urlsplit(url)
            url = urlunsplit((self._target.scheme, self._target.netloc, parts.path, parts.query, ""))
        self.last_response = None
        response = super().request(
            method, url, params=params, data=data, headers=headers, auth=auth,
            timeout=timeout, allow_redirects=allow_redirects,
        )
        self.last_response = response
        return response

    def log_request(self, kwargs: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio request: %s %s", kwargs["method"], kwargs["url"])

    def log_response(self, status_code: int, response: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio response: %s", status_code)


class AsyncRedirectingHttpClient(AsyncTwilioHttpClient):
    """``AsyncTwilioHttpClient`` that sends every request to ``base_url`` (scheme + host[:port]), with
    one pooled aiohttp session, explicit timeouts and no retries.

    The session is created on first use, on the loop the request runs on (the provider event loop):
    an aiohttp session belongs to one loop. Its ``TCPConnector`` keeps at most ``pool_size``
    connections; ``timeouts`` become ``aiohttp.ClientTimeout(total=, sock_connect=, sock_read=)``.
    ``request`` is overridden whole (same contract as ``AsyncTwilioHttpClient.request``): the base
    class would pass the SDK's per-call ``timeout`` (``None``) to aiohttp, which means no timeout.
    The answer is also stored in a context variable for ``Retry-After`` (see ``_last_response``).
    """

    def __init__(self, base_url: str | None, timeouts: CallTimeouts, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        # pool_connections=False: no session outside a running loop; max_retries=None: no RetryClient.
        super().__init__(pool_connections=False, timeout=timeouts.read, max_retries=None)
        self._target = urlsplit(base_url) if base_url else None
        self._timeouts = timeouts
        self._pool_size = pool_size
        self.session: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size),
                timeout=aiohttp.ClientTimeout(total=self._timeouts.total, sock_connect=self._timeouts.connect,
                                              sock_read=self._timeouts.read),
                trust_env=False,
            )
        return self.session

    async def request(
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,
        allow_redirects: bool = False,
    ) -> Response:
        """Same contract as ``AsyncTwilioHttpClient.request``; scheme and host are swapped.

        Raises:
            aiohttp.ClientError, asyncio.TimeoutError: no answer (see the backend's ``send``).
        """
        if self._target is not None:
            parts = urlsplit(url)
            url = urlunsplit((self._target.scheme, self._target.netloc, parts.path, parts.query, ""))
        _last_response.set(None)
        per_call = None if timeout is None else aiohttp.ClientTimeout(
            total=min(timeout, self._timeouts.total), sock_connect=self._timeouts.connect,
            sock_read=self._timeouts.read)
        if auth is not None:
            headers = {**(headers or {}), "Authorization": aiohttp.encode_basic_auth(auth[0], auth[1])}
        kwargs: dict[str, Any] = {"params": params, "data": data, "headers": headers,
                                  "allow_redirects": allow_redirects}
        if per_call is not None:
            kwargs["timeout"] = per_call
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio request: %s %s", method.upper(), url)
        async with self._session().request(method.upper(), url, **kwargs) as answer:
            response = Response(answer.status, await answer.text(), answer.headers)
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio response: %s", answer.status)
        _last_response.set(response)
        return response

    async def close(self) -> None:
        """Close the pooled session (on the loop it belongs to). Idempotent."""
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()


def last_response() -> Response | None:
    """The answer to the request the current asyncio task made last through an
    :class:`AsyncRedirectingHttpClient` (``None`` before any, or when it got no answer)."""
    return _last_response.get()

"""FCM HTTP v1 push backend on ``firebase-admin`` (pinned 7.7.0).

Sends go through ``messaging.send_each_async``, one message a call in a sliding window, on this
process's provider event loop (providers/event_loop.py), through one pooled aiohttp client per
backend instance (providers/fcm/async_client.py): no SDK retries, explicit timeouts, at most
``concurrency`` requests in flight; :meth:`FcmPushBackend.send` is a batch of one. Each instance owns
a named Firebase app (deleted in ``close()``); the private SDK hooks are in providers/fcm/sdk_hooks.py.
The OAuth token is fetched on an executor thread before a batch. Retries, tokens and error
classification: docs/PROVIDERS.md §3 and "Async SDK paths".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import ClassVar

import firebase_admin
import google.auth.exceptions
import google.auth.transport.requests
import httpx
from firebase_admin import credentials, exceptions, messaging

from providers import event_loop
from providers.base import (
    BatchGate,
    BatchListener,
    CallSkipped,
    CallTimeouts,
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    PushBackend,
    SendResult,
    TransientProviderError,
    UnexpectedProviderError,
    transport_code,
)
from providers.fcm.async_client import PooledFcmClient
from providers.fcm.data_keys import NOTIFICATION_ID_KEY
from providers.fcm.sdk_hooks import install_async_client, redirect_fcm

__all__ = ["SILENT_BODY_KEY", "SILENT_TITLE_KEY", "FcmPushBackend", "build_message", "local_service_account",
           "redirect_fcm"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
FCM_ERROR_DETAIL = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_DETAIL = "type.googleapis.com/google.rpc.BadRequest"
#: ``fieldViolations[].field`` values that name the device token (docs/PROVIDERS.md §3(b)).
TOKEN_FIELDS = frozenset({"message.token", "message.fid"})

_app_numbers = itertools.count(1)

@functools.lru_cache(maxsize=1)
def _local_private_key_pem() -> str:
    """A process-wide RSA key (PEM) for the offline service account; generated once, never stored."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


def local_service_account(project_id: str, token_uri: str) -> dict[str, str]:
    """An in-memory service-account dict whose OAuth token endpoint is ``token_uri``.

    google-auth signs an RS256 JWT with the local key and exchanges it at ``token_uri``
    (docs/PROVIDERS.md §3(a) option 1), so 401 handling behaves as with real credentials.
    """
    return {
        "type": "service_account",
        "project_id": project_id,
        "private_key_id": "local",
        "private_key": _local_private_key_pem(),
        "client_email": f"notify-local@{project_id}.iam.gserviceaccount.com",
        "client_id": "0",
        "token_uri": token_uri,
    }


#: ``data`` keys that carry a silent push's title and body (unless the caller's data has them).
SILENT_TITLE_KEY = "title"
SILENT_BODY_KEY = "body"


def build_message(message: OutboundMessage) -> messaging.Message:
    """The FCM ``Message`` for one device token (docs/PROVIDERS.md §3(b), "Silent pushes and sender
    overrides").

    Every push: ``data`` = ``message.data`` plus ``notification_id``; Android ``collapse_key`` and
    ``ttl``; APNs ``apns-collapse-id`` and, with a TTL, ``apns-expiration``. A normal push has a
    ``notification`` block, priority by ``message.priority`` and ``apns-push-type: alert``. A silent
    push is data-only (title and body in ``data``, a key already given left as given), iOS
    ``apns-push-type: background``, ``apns-priority: 5``, ``content-available: 1``, Android priority
    ``normal``: best effort (the table and Apple's and FCM's rules: docs/PROVIDERS.md).

    Raises:
        ValueError: the SDK refuses the message (e.g. a malformed TTL); no request was made.
    """
    high = message.priority == "high" and not message.silent
    data = {str(k): str(v) for k, v in (message.data or {}).items()}
    data[NOTIFICATION_ID_KEY] = message.notification_id
    ttl = dt.timedelta(seconds=message.ttl_seconds) if message.ttl_seconds is not None else None
    apns_headers = {"apns-push-type": "background" if message.silent else "alert",
                    "apns-priority": "10" if high else "5"}
    if message.collapse_key:
        apns_headers["apns-collapse-id"] = message.collapse_key
    if message.ttl_seconds is not None:
        apns_headers["apns-expiration"] = str(int(time.time()) + int(message.ttl_seconds))
    if message.silent:
        if message.title is not None:
            data.setdefault(SILENT_TITLE_KEY, message.title)
        data.setdefault(SILENT_BODY_KEY, message.body)
        notification = None
        apns = messaging.APNSConfig(headers=apns_headers,
                                    payload=messaging.APNSPayload(aps=messaging.Aps(content_available=True)))
    else:
        notification = messaging.Notification(title=message.title, body=message.body)
        apns = messaging.APNSConfig(headers=apns_headers)
    fcm_message = messaging.Message(
        data=data,
        notification=notification,
        android=messaging.AndroidConfig(
            collapse_key=message.collapse_key, priority="high" if high else "normal", ttl=ttl,
        ),
        apns=apns,
    )
    # Device registration tokens go on the wire as "token". Message(token=...) emits a
    # DeprecationWarning on every construction in 7.7 (it prefers Firebase installation ids), so
    # the public attribute is set after construction instead.
    fcm_message.token = message.to
    return fcm_message


@dataclass
class FcmPushBackend(PushBackend):
    """Send push notifications through FCM HTTP v1 (Android, iOS via APNs, web).

    Options (``settings.PROVIDERS["push"][i]["OPTIONS"]``): PROJECT_ID (required); CREDENTIALS (a
    service-account JSON path, or ``None`` for an offline account whose token endpoint is TOKEN_URI:
    the emulator); FCM_URL (``None`` for real FCM, else a URL template with ``{0}`` for the project);
    TOKEN_URI; TIMEOUT (read timeout, default 10), CONNECT_TIMEOUT, TOTAL_TIMEOUT
    (providers.base.CallTimeouts; docs/PROVIDERS.md "Timeouts"); POOL_SIZE (pooled connections,
    default 100; also caps ``concurrency``).

    ``send`` returns ``SendResult(provider="fcm", provider_message_id="projects/<p>/messages/<id>",
    raw_status=None)``.
    """

    name: ClassVar[str] = "fcm"
    required_options: ClassVar[tuple[str, ...]] = ("PROJECT_ID",)

    _app: firebase_admin.App | None = field(default=None, init=False, repr=False)
    _client: PooledFcmClient | None = field(default=None, init=False, repr=False)
    _client_loop: tuple[int, int] | None = field(default=None, init=False, repr=False)
    _refresh_lock: asyncio.Lock | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Create this instance's Firebase app, redirect it if FCM_URL is set, and give it the
        pooled async client (providers/fcm/sdk_hooks.py). Idempotent; after a fork the app is
        rebuilt for the child's own event loop (the parent's client and sockets are left alone).

        No network I/O: the OAuth token is fetched on the first send.

        Raises:
            ProviderConfigurationError: missing option, unreadable credentials, or a vanished SDK hook.
        """
        loop = event_loop.loop_id()
        if self._app is not None and self._client_loop == loop:
            return
        if self._app is not None:  # inherited across a fork: forget it, never close the parent's pool
            self._app = self._client = None
        project_id = self.option("PROJECT_ID")
        timeouts = self.timeouts()
        cred_path = self.option("CREDENTIALS", None)
        try:
            if cred_path:
                cred = credentials.Certificate(os.fspath(cred_path))
            else:
                cred = credentials.Certificate(local_service_account(project_id, self.option("TOKEN_URI")))
        except (OSError, ValueError) as exc:
            raise ProviderConfigurationError(self.name, f"cannot load FCM credentials: {exc}") from exc
        app = firebase_admin.initialize_app(
            cred,
            options={"projectId": project_id, "httpTimeout": timeouts.read},
            name=f"notify-fcm-{os.getpid()}-{next(_app_numbers)}",
        )
        try:
            fcm_url = self.option("FCM_URL", None)
            if fcm_url:
                redirect_fcm(app, fcm_url.format(project_id))
            client = PooledFcmClient(app.credential.get_credential(), timeouts,
                                     self.pool_size())
            install_async_client(app, client)
        except BaseException:
            firebase_admin.delete_app(app)
            raise
        self._app, self._client, self._client_loop = app, client, loop
        self._refresh_lock = None

    def close(self) -> None:
        """Close the pooled client (on its loop) and delete this instance's Firebase app. Idempotent."""
        if self._app is None:
            return
        app, client, self._app, self._client = self._app, self._client, None, None
        if client is not None and self._client_loop == event_loop.loop_id():
            try:
                event_loop.run(client.aclose(), timeout=5)
            except Exception:  # closing must never mask the caller's work
                logger.warning("fcm: closing the async client failed", exc_info=True)
        try:
            firebase_admin.delete_app(app)
        except (ValueError, RuntimeError) as exc:
            logger.debug("fcm: deleting firebase app %s: %s", app.name, exc)

    def timeouts(self) -> CallTimeouts:
        """This instance's request timeouts (``TIMEOUT``, ``CONNECT_TIMEOUT``, ``TOTAL_TIMEOUT``)."""
        return CallTimeouts.from_options(self.options, DEFAULT_TIMEOUT_SECONDS)

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message to the device token ``message.to``: a batch of one on the async path (why:
        docs/PROVIDERS.md, "Async SDK paths").

        Raises:
            ContactInvalidError: UNREGISTERED / SENDER_ID_MISMATCH (``unregistered_token``), INVALID_ARGUMENT
                naming the token field (``invalid_token``).
            PermanentProviderError: other INVALID_ARGUMENT and 4xx, or a message the SDK will not encode.
            TransientProviderError: QUOTA_EXCEEDED, UNAVAILABLE/INTERNAL/5xx (``retry_after`` from
                ``Retry-After``, never slept), ``timeout`` / ``connection_lost`` (outcome unknown),
                ``connection_error``, ``token_endpoint_unreachable``; each after one push request.
            ProviderConfigurationError: UNAUTHENTICATED/THIRD_PARTY_AUTH_ERROR, PERMISSION_DENIED,
                OAuth token refused.
        """
        [outcome] = self.send_batch([message])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def send_batch(self, messages: list[OutboundMessage], concurrency: int = 1, *, gate: BatchGate | None = None,
                   on_result: BatchListener | None = None) -> list[SendResult | Exception]:
        """Send each message with its own ``messaging.send_each_async([message])``, as a sliding window:
        at most ``concurrency`` (and ``POOL_SIZE``) requests in flight, the next starting as soon as any
        ends; ``gate`` and ``on_result``: :meth:`ProviderBackend.send_batch`, on the provider event loop.
        One message per call costs the same client CPU as 500 per call and makes each outcome known when
        it ends (docs/PROVIDERS.md, "Async SDK paths").

        Returns one ``SendResult`` or exception (as :meth:`send` raises them) per message, in input
        order; never raises. FCM has no idempotency key: the collapse key makes a duplicate show once
        (docs/PROVIDERS.md, "Duplicate window").
        """
        if not messages:
            return []
        try:
            self.open()
        except ProviderConfigurationError as exc:
            return [exc] * len(messages)
        limit = self.in_flight_limit(concurrency, len(messages))
        backstop = (-(-len(messages) // limit) + 1) * self.timeouts().total + 10.0
        try:
            return event_loop.run(self._send_all(messages, limit, gate, on_result), timeout=backstop)
        except TimeoutError:
            return [TransientProviderError(self.name, "timeout", f"batch not answered within {backstop:.0f} s")
                    for _ in messages]

    async def _send_all(self, messages: list[OutboundMessage], limit: int, gate: BatchGate | None,
                        on_result: BatchListener | None) -> list[SendResult | Exception]:
        built: list[messaging.Message | Exception] = []
        for message in messages:
            try:
                built.append(build_message(message))
            except ValueError as exc:
                built.append(_caused(PermanentProviderError(self.name, "invalid_message", str(exc)[:300]), exc))
        failure = await self._fresh_token() if any(not isinstance(b, Exception) for b in built) else None
        slots = asyncio.Semaphore(limit)

        async def one(index: int, payload: messaging.Message | Exception) -> SendResult | Exception:
            refused = payload if isinstance(payload, Exception) else failure
            if refused is None:
                async with slots:
                    if gate is not None and not gate(index):
                        return CallSkipped()
                    started = time.monotonic()
                    outcome = await self._send_one(payload)
                    latency_ms = int((time.monotonic() - started) * 1000)
                if on_result is not None:
                    on_result(index, outcome, latency_ms)
                return outcome
            if on_result is not None:
                on_result(index, refused, 0)
            return refused

        return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(built))))

    async def _send_one(self, message: messaging.Message) -> SendResult | Exception:
        """One ``send_each_async([message])``: the outcome, returned, never raised."""
        try:
            batch = await messaging.send_each_async([message], app=self._app)
        except ValueError as exc:  # the SDK refused to encode it: nothing was sent
            return _caused(PermanentProviderError(self.name, "invalid_message", str(exc)[:300]), exc)
        except exceptions.FirebaseError as exc:  # the gather itself failed (an SDK surprise)
            return _caused(self._classify(exc), exc)
        [response] = batch.responses
        if response.success:
            return SendResult(provider=self.name, provider_message_id=response.message_id)
        if isinstance(response.exception, exceptions.FirebaseError):
            return _caused(self._classify(response.exception), response.exception)
        return TransientProviderError(self.name, "no_message_id", "FCM answered without a name")

    async def _fresh_token(self) -> Exception | None:
        """Fetch the OAuth token if the cached one is missing or expiring (google-auth, on an
        executor thread: it is synchronous). Returns the batch's error, or ``None``."""
        credential = self._app.credential.get_credential()  # type: ignore[union-attr]
        if credential.valid:
            return None
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            if credential.valid:
                return None
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, credential.refresh, google.auth.transport.requests.Request())
            except google.auth.exceptions.GoogleAuthError as exc:
                return self._token_error(exc)
            except Exception as exc:
                return UnexpectedProviderError("fcm", type(exc).__name__[:64], f"token refresh: {exc}"[:300])
        return None

    def _token_error(self, exc: google.auth.exceptions.GoogleAuthError) -> Exception:
        if isinstance(exc, google.auth.exceptions.TransportError):
            # No push was sent: the OAuth token request (google-auth) itself failed.
            return _caused(TransientProviderError(self.name, "token_endpoint_unreachable",
                                                  f"OAuth token endpoint unreachable ({transport_code(exc)})"), exc)
        if getattr(exc, "retryable", False):
            return _caused(TransientProviderError(self.name, "token_refresh", str(exc)[:300]), exc)
        return _caused(ProviderConfigurationError(self.name, f"OAuth token refused: {str(exc)[:300]}",
                                                  code="token_refresh"), exc)

    def _classify(self, exc: exceptions.FirebaseError) -> Exception:
        """Map a FirebaseError to our hierarchy (docs/PROVIDERS.md §3(c))."""
        auth_failure = _google_auth_error(exc)
        if auth_failure is not None:
            return self._token_error(auth_failure)
        response = exc.http_response
        status = response.status_code if response is not None else None
        error_code, fields = _error_details(response)
        code = error_code or str(exc.code)
        text = str(exc)[:300]
        if isinstance(exc, (messaging.UnregisteredError, messaging.SenderIdMismatchError)):
            return ContactInvalidError(self.name, code, text, reason="unregistered_token", http_status=status)
        if isinstance(exc, (exceptions.UnauthenticatedError, exceptions.PermissionDeniedError)):
            return ProviderConfigurationError(self.name, text, code=code, http_status=status)
        if isinstance(exc, exceptions.InvalidArgumentError):
            if fields & TOKEN_FIELDS or "registration token" in text:
                return ContactInvalidError(self.name, code, text, reason="invalid_token", http_status=status)
            return PermanentProviderError(self.name, code, text, http_status=status)
        if isinstance(exc, exceptions.ResourceExhaustedError):
            return TransientProviderError(
                self.name, code, text, http_status=status, retry_after=_retry_after(response),
            )
        if response is None:
            # No HTTP answer: connection refused/reset or timed out (httpx error as cause).
            return TransientProviderError(self.name, transport_code(exc.cause), text)
        if status >= 500 or isinstance(  # type: ignore[operator]
            exc, (exceptions.UnavailableError, exceptions.InternalError, exceptions.DeadlineExceededError)
        ):
            return TransientProviderError(
                self.name, code, text, http_status=status, retry_after=_retry_after(response),
            )
        return PermanentProviderError(self.name, code, text, http_status=status)


def _error_details(response: httpx.Response | None) -> tuple[str | None, set[str]]:
    """``(FcmError.errorCode, {BadRequest fieldViolations[].field})`` from an FCM error body."""
    if response is None:
        return None, set()
    try:
        details = json.loads(response.content)["error"].get("details") or []
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, set()
    error_code = None
    fields: set[str] = set()
    for detail in details:
        if not isinstance(detail, dict):
            continue
        if detail.get("@type") == FCM_ERROR_DETAIL and error_code is None:
            error_code = detail.get("errorCode")
        elif detail.get("@type") == BAD_REQUEST_DETAIL:
            fields.update(str(v.get("field", "")) for v in detail.get("fieldViolations") or [])
    return error_code, fields


def _retry_after(response: httpx.Response | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds form only), or ``None``."""
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _google_auth_error(exc: BaseException) -> google.auth.exceptions.GoogleAuthError | None:
    """The google-auth error in ``exc``'s cause chain (a token refresh failing after a 401), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, google.auth.exceptions.GoogleAuthError):
            return current
        current = getattr(current, "cause", None) or current.__cause__
    return None


def _caused(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error

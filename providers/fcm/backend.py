"""FCM HTTP v1 push backend on ``firebase-admin`` (pinned 7.7.0).

Each backend instance owns a named Firebase app (deleted in ``close()``). ``messaging.send`` is used,
one HTTP call per device and sequential (``send_each`` starts a thread per message).

firebase-admin has no public endpoint override (docs/PROVIDERS.md §3(a)); :func:`redirect_fcm` sets the
private ``_MessagingService._fcm_url`` of this app's messaging service, and raises
ProviderConfigurationError if that hook disappears in an SDK upgrade.

The SDK makes no retries and never sleeps: every retry is the pipeline's (scheduled, recorded,
counted against the attempt budget). firebase-admin mounts urllib3
``Retry(connect=1, read=1, status=4, status_forcelist=[500, 503], allowed_methods=None,
respect_retry_after_header=True)`` on its messaging session (docs/PROVIDERS.md, "The SDKs' own retries
and async paths"): a read timeout re-sent the push (a duplicate no attempt log shows), a 500/503 was
sent five times, and a 429/503 with ``Retry-After`` slept that long inside the call (longer than a
row's lease). :func:`disable_sdk_retries`, another private hook, re-mounts every adapter of that
session with ``Retry(total=0)``, so one ``send`` is one push request and the FCM error (with its
``Retry-After`` as ``retry_after``) reaches us at once. google-auth's refresh-on-401 stays: it
re-sends only a request FCM refused as unauthenticated (not accepted, so no duplicate).

Deadline: ``TIMEOUT`` is the SDK's ``httpTimeout``, the connect and the read timeout of each HTTP
request. A send is one push request, preceded by an OAuth token request when the cached token is
missing or expiring; a 401 adds at most two (token request + push) rounds (google-auth's
``max_refresh_attempts``). Not covered here: google-auth's OAuth token request itself retries a
5xx/429 of the token endpoint up to 3 attempts, sleeping about 1 s and 2 s between them
(``google.oauth2._client``); that re-sends no push, but adds time to the call. Errors are classified
per docs/PROVIDERS.md §3(c).
"""

from __future__ import annotations

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
import requests
import requests.adapters
from firebase_admin import credentials, exceptions, messaging
from urllib3.util.retry import Retry

from providers.base import (
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    PushBackend,
    SendResult,
    TransientProviderError,
    transport_code,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
FCM_ERROR_DETAIL = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST_DETAIL = "type.googleapis.com/google.rpc.BadRequest"
#: ``fieldViolations[].field`` values that name the device token (docs/PROVIDERS.md §3(b)).
TOKEN_FIELDS = frozenset({"message.token", "message.fid"})

_app_numbers = itertools.count(1)

#: No retry of any kind (connect, read, status, redirect, Retry-After): read errors surface as
#: ``requests.ReadTimeout`` (firebase-admin maps it to ``DeadlineExceededError``), and an HTTP error
#: answer is returned as is so the SDK maps it to its FirebaseError subclass.
NO_RETRY = Retry(
    total=0, connect=0, read=False, redirect=0, status=0, other=0, status_forcelist=(),
    respect_retry_after_header=False, raise_on_status=False, backoff_factor=0,
)


def redirect_fcm(app: firebase_admin.App, url: str) -> None:
    """Point ``app``'s messaging service at ``url`` (an absolute ``…/messages:send`` URL).

    Raises:
        ProviderConfigurationError: firebase-admin no longer has the private ``_fcm_url`` hook.
    """
    get_service = getattr(messaging, "_get_messaging_service", None)
    if get_service is None:
        raise ProviderConfigurationError(
            "fcm", "firebase_admin.messaging._get_messaging_service is gone: cannot redirect FCM "
            "(see docs/PROVIDERS.md §3(a); pin firebase-admin or update the hook)",
            code="sdk_hook_missing",
        )
    service = get_service(app)
    if not hasattr(service, "_fcm_url"):
        raise ProviderConfigurationError(
            "fcm", "firebase_admin _MessagingService._fcm_url is gone: cannot redirect FCM "
            "(see docs/PROVIDERS.md §3(a); pin firebase-admin or update the hook)",
            code="sdk_hook_missing",
        )
    service._fcm_url = url


def disable_sdk_retries(app: firebase_admin.App) -> None:
    """Re-mount every adapter of ``app``'s messaging session with :data:`NO_RETRY`.

    firebase-admin 7.7 mounts its retrying adapter on ``http://``, ``https://`` and
    ``https://fcm.googleapis.com`` (``_http_client.HttpClient``, ``_MessagingService.__init__``);
    each prefix the session has gets a fresh ``HTTPAdapter`` with the same pool sizes. Only the sync
    path (``messaging.send``) is covered: the async client (``send_each_async``) is not used here.

    Raises:
        ProviderConfigurationError: ``code="sdk_hook_missing"`` if the private attribute path
            ``messaging._get_messaging_service(app)._client.session.adapters`` is gone.
    """
    get_service = getattr(messaging, "_get_messaging_service", None)
    session = getattr(getattr(get_service(app), "_client", None), "session", None) if get_service else None
    adapters = getattr(session, "adapters", None)
    if not isinstance(adapters, dict) or not adapters or not hasattr(session, "mount"):
        raise ProviderConfigurationError(
            "fcm", "firebase_admin messaging._get_messaging_service(app)._client.session is gone: cannot "
            "disable the SDK's retries (see docs/PROVIDERS.md, \"The SDKs' own retries\"; "
            "pin firebase-admin or update the hook)",
            code="sdk_hook_missing",
        )
    for prefix, old in list(adapters.items()):
        session.mount(prefix, requests.adapters.HTTPAdapter(  # type: ignore[union-attr]
            pool_connections=getattr(old, "_pool_connections", requests.adapters.DEFAULT_POOLSIZE),
            pool_maxsize=getattr(old, "_pool_maxsize", requests.adapters.DEFAULT_POOLSIZE),
            pool_block=getattr(old, "_pool_block", requests.adapters.DEFAULT_POOLBLOCK),
            max_retries=NO_RETRY,
        ))
        old.close()


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


def build_message(message: OutboundMessage) -> messaging.Message:
    """The FCM ``Message`` for one device token (docs/PROVIDERS.md §3(b)).

    ``data`` = ``message.data`` plus ``notification_id``; Android ``collapse_key``/``priority``
    ("high" or "normal")/``ttl``; APNs headers ``apns-collapse-id``, ``apns-priority`` (10 or 5) and
    ``apns-expiration`` (absolute UTC epoch seconds) when a TTL is set.
    """
    high = message.priority == "high"
    data = {str(k): str(v) for k, v in (message.data or {}).items()}
    data["notification_id"] = message.notification_id
    ttl = dt.timedelta(seconds=message.ttl_seconds) if message.ttl_seconds is not None else None
    apns_headers = {"apns-priority": "10" if high else "5"}
    if message.collapse_key:
        apns_headers["apns-collapse-id"] = message.collapse_key
    if message.ttl_seconds is not None:
        apns_headers["apns-expiration"] = str(int(time.time()) + int(message.ttl_seconds))
    fcm_message = messaging.Message(
        data=data,
        notification=messaging.Notification(title=message.title, body=message.body),
        android=messaging.AndroidConfig(
            collapse_key=message.collapse_key, priority="high" if high else "normal", ttl=ttl,
        ),
        apns=messaging.APNSConfig(headers=apns_headers),
    )
    # Device registration tokens go on the wire as "token". Message(token=...) emits a
    # DeprecationWarning on every construction in 7.7 (it prefers Firebase installation ids), so
    # the public attribute is set after construction instead.
    fcm_message.token = message.to
    return fcm_message


@dataclass
class FcmPushBackend(PushBackend):
    """Send push notifications through FCM HTTP v1 (Android, iOS via APNs, web).

    Options (``settings.PROVIDERS["push"][i]["OPTIONS"]``):
        PROJECT_ID: required.
        CREDENTIALS: path to a service-account JSON file, or ``None`` for an offline account signed
            with a fresh local RSA key whose token endpoint is TOKEN_URI (emulator use).
        FCM_URL: ``None`` for real FCM, else a URL template with ``{0}`` for the project id, e.g.
            ``"http://127.0.0.1:8900/v1/projects/{0}/messages:send"``.
        TOKEN_URI: OAuth token endpoint, used (and required) only when CREDENTIALS is ``None``.
        TIMEOUT: seconds, the connect and the read timeout of each HTTP request (Firebase
            ``httpTimeout``), default 10. There are no SDK retries, so a push request never takes
            longer; see the module docstring for the token and 401 requests a send may add.

    ``send`` returns ``SendResult(provider="fcm", provider_message_id="projects/<p>/messages/<id>",
    raw_status=None)``.
    """

    name: ClassVar[str] = "fcm"
    required_options: ClassVar[tuple[str, ...]] = ("PROJECT_ID",)

    _app: firebase_admin.App | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Create this instance's Firebase app, disable the SDK's retries on its messaging session
        (:func:`disable_sdk_retries`) and redirect it if FCM_URL is set. Idempotent.

        No network I/O: the OAuth token is fetched on the first send.

        Raises:
            ProviderConfigurationError: missing option, unreadable credentials, or a vanished SDK hook.
        """
        if self._app is not None:
            return
        project_id = self.option("PROJECT_ID")
        timeout = float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS))
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
            options={"projectId": project_id, "httpTimeout": timeout},
            name=f"notify-fcm-{os.getpid()}-{next(_app_numbers)}",
        )
        try:
            disable_sdk_retries(app)
            fcm_url = self.option("FCM_URL", None)
            if fcm_url:
                redirect_fcm(app, fcm_url.format(project_id))
        except BaseException:
            firebase_admin.delete_app(app)
            raise
        self._app = app

    def close(self) -> None:
        """Delete this instance's Firebase app; its HTTP sessions go with it. Idempotent."""
        if self._app is None:
            return
        app, self._app = self._app, None
        try:
            firebase_admin.delete_app(app)
        except (ValueError, RuntimeError) as exc:
            # RuntimeError: the SDK closes its async client with asyncio.run(), which fails inside
            # a running event loop; the app is unregistered anyway.
            logger.debug("fcm: deleting firebase app %s: %s", app.name, exc)

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message to the device token ``message.to``.

        Raises:
            ContactInvalidError: UNREGISTERED / SENDER_ID_MISMATCH (``reason="unregistered_token"``),
                INVALID_ARGUMENT naming the token field (``reason="invalid_token"``).
            PermanentProviderError: other INVALID_ARGUMENT and 4xx answers, or a message the SDK
                refuses to encode (``code="invalid_message"``).
            TransientProviderError: QUOTA_EXCEEDED and UNAVAILABLE/INTERNAL/5xx (``retry_after``
                in seconds from ``Retry-After``, else ``None``), ``code="timeout"`` (no answer within
                TIMEOUT: the push may have been accepted), ``code="connection_error"``. Each after
                exactly one push request (the SDK does not retry).
            ProviderConfigurationError: UNAUTHENTICATED/THIRD_PARTY_AUTH_ERROR, PERMISSION_DENIED,
                OAuth token refused.
        """
        self.open()
        try:
            fcm_message = build_message(message)
            name = messaging.send(fcm_message, app=self._app)
        except exceptions.FirebaseError as exc:
            raise self._classify(exc) from exc
        except google.auth.exceptions.TransportError as exc:
            # No push was sent: the OAuth token request (google-auth) itself failed.
            raise TransientProviderError(self.name, "token_endpoint_unreachable",
                                         f"OAuth token endpoint unreachable ({transport_code(exc)})") from exc
        except google.auth.exceptions.RefreshError as exc:
            if getattr(exc, "retryable", False):
                raise TransientProviderError(self.name, "token_refresh", str(exc)[:300]) from exc
            raise ProviderConfigurationError(
                self.name, f"OAuth token refused: {str(exc)[:300]}", code="token_refresh",
            ) from exc
        except ValueError as exc:
            raise PermanentProviderError(self.name, "invalid_message", str(exc)[:300]) from exc
        return SendResult(provider=self.name, provider_message_id=name)

    def _classify(self, exc: exceptions.FirebaseError) -> Exception:
        """Map a FirebaseError to our hierarchy (docs/PROVIDERS.md §3(c))."""
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
            # No HTTP answer: connection refused/reset or timed out (requests error as cause).
            return TransientProviderError(self.name, transport_code(exc.cause), text)
        if status >= 500 or isinstance(  # type: ignore[operator]
            exc, (exceptions.UnavailableError, exceptions.InternalError, exceptions.DeadlineExceededError)
        ):
            return TransientProviderError(
                self.name, code, text, http_status=status, retry_after=_retry_after(response),
            )
        return PermanentProviderError(self.name, code, text, http_status=status)


def _error_details(response: requests.Response | None) -> tuple[str | None, set[str]]:
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


def _retry_after(response: requests.Response | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds form only), or ``None``."""
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None

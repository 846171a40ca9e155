"""The private firebase-admin (pinned 7.7.0) hooks the FCM backend relies on, all in this one place.

firebase-admin has no public way to point messaging at another endpoint nor to give
``send_each_async`` another HTTP client (docs/PROVIDERS.md §3(a), "The private hooks"). Each
function checks that the private attribute it needs still exists and raises
ProviderConfigurationError(code="sdk_hook_missing") when an SDK upgrade removed it, so a broken hook
fails loudly at ``open()`` instead of sending to Google or retrying behind our back;
tests/providers/test_async_paths.py fails if any of them disappears.
"""

from __future__ import annotations

from typing import Any

import firebase_admin
from firebase_admin import messaging

from providers.base import ProviderConfigurationError

_SEE = "(see docs/PROVIDERS.md, \"Async SDK paths\"; pin firebase-admin or update providers/fcm/sdk_hooks.py)"


def _missing(what: str) -> ProviderConfigurationError:
    return ProviderConfigurationError("fcm", f"{what} is gone {_SEE}", code="sdk_hook_missing")


def messaging_service(app: firebase_admin.App) -> Any:
    """``app``'s private ``_MessagingService``.

    Raises:
        ProviderConfigurationError: ``code="sdk_hook_missing"``.
    """
    get_service = getattr(messaging, "_get_messaging_service", None)
    if get_service is None:
        raise _missing("firebase_admin.messaging._get_messaging_service")
    return get_service(app)


def redirect_fcm(app: firebase_admin.App, url: str) -> None:
    """Point ``app``'s messaging service at ``url`` (an absolute ``…/messages:send`` URL).

    Raises:
        ProviderConfigurationError: ``code="sdk_hook_missing"``, no private ``_fcm_url`` any more.
    """
    service = messaging_service(app)
    if not hasattr(service, "_fcm_url"):
        raise _missing("firebase_admin _MessagingService._fcm_url")
    service._fcm_url = url


def install_async_client(app: firebase_admin.App, client: Any) -> None:
    """Make ``send_each_async`` on ``app`` post through ``client`` (an object with
    ``async request(method, url, **kwargs)`` returning an answer with ``json()`` and raising
    ``httpx.HTTPError``, and ``async aclose()``: providers.fcm.async_client.PooledFcmClient)
    instead of the SDK's retrying ``HttpxAsyncClient``.

    Raises:
        ProviderConfigurationError: ``code="sdk_hook_missing"``, no private ``_async_client``.
    """
    service = messaging_service(app)
    if not hasattr(service, "_async_client"):
        raise _missing("firebase_admin _MessagingService._async_client")
    service._async_client = client


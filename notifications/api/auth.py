"""API-key authentication: ``Authorization: Api-Key <key>`` (djangorestframework-api-key), and the
scope each operation needs.

Keys are stored hashed; the lookup is by the key's prefix, then a constant-time comparison
(:func:`key_owner`); a matching key may still be ``revoked_api_key`` or ``expired_api_key``, any
other is ``invalid_api_key``. ``request.auth`` is the :class:`~notifications.models.APIClient`.
Every view declares ``required_scopes = {"get": Scope.READ, …}``; :class:`HasRequiredScope` refuses
a key without the scope (403 ``missing_scope``) and a method with no declared scope (fail closed);
tests/test_scopes.py walks every URL so no endpoint forgets. docs/API.md, "Authentication and scopes".
"""

from __future__ import annotations

import time
from datetime import UTC

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework_api_key.permissions import KeyParser

from core import clock
from core.api.refusals import MissingScope
from core.api.scopes import Scope
from notifications.models import APIClient


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Api-Key"

    def authenticate(self, request):
        header = request._request.headers.get("Authorization", "")
        scheme = header.split(" ", 1)[0] if header else ""
        if header and scheme.lower() != self.keyword.lower():
            shown = scheme[:20] if scheme.isprintable() else "?"
            raise exceptions.AuthenticationFailed(
                f"the scheme must be Api-Key: send `Authorization: Api-Key <key>` (got '{shown}')",
                code="wrong_auth_scheme")
        key = KeyParser().get(request._request)
        if not key:
            if header:
                raise exceptions.AuthenticationFailed("no key after Api-Key: send `Authorization: Api-Key <key>`",
                                                      code="invalid_api_key")
            return None
        client = key_owner(key)
        if client is None:
            raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key")
        if client.revoked:
            raise exceptions.AuthenticationFailed("this API key is revoked", code="revoked_api_key")
        if client.has_expired:
            raise exceptions.AuthenticationFailed(
                f"this API key expired at {client.expiry_date.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}",
                code="expired_api_key")
        return (None, client)

    def authenticate_header(self, request) -> str:
        return self.keyword


def key_owner(key: str) -> APIClient | None:
    """The API client whose key ``key`` is, revoked and expired ones included, or None.

    Looked up by the key's public prefix, then the library's constant-time hash comparison
    (``APIClient.is_valid``); only a matching secret tells a revoked key from an unknown one, so
    nothing is learned about a key without its secret. (``APIClient.objects.get_from_key`` leaves
    revoked keys out, so a revoked key read as unknown.)

    A client whose secret matched is remembered per process for ``API_KEY_CACHE_SECONDS`` (one query
    per request saved). The secret is compared on every request, and one that does not match the
    remembered hash reads the row again (a key rotated elsewhere works at once); a save in this
    process forgets the client at once (:func:`forget_client`); a revocation, expiry, scope change or
    rotation made elsewhere is honoured within the TTL."""
    prefix, _, _ = key.partition(".")
    cached = _cached_client(prefix)
    if cached is not None and cached.is_valid(key):
        return cached
    # Not remembered, or not this secret: the row decides (a key rotated elsewhere works at once).
    client = APIClient.objects.filter(prefix=prefix).first()
    if client is None or not client.is_valid(key):
        return None
    _remember(prefix, client)
    return client


#: prefix → (read at, deadline on :func:`_cache_clock`, client); only clients found, never unknown
#: prefixes. An entry read "after" now (the clock moved back) is stale too.
_clients: dict[str, tuple[float, float, APIClient]] = {}
_MAX_CACHED = 1024


def _cache_clock() -> float:
    """Monotonic seconds, moved with the platform's test clock (core.clock) so tests see the TTL end."""
    return time.monotonic() + clock.offset_seconds()


def _cached_client(prefix: str) -> APIClient | None:
    entry = _clients.get(prefix)
    if entry is None:
        return None
    if not entry[0] <= _cache_clock() < entry[1]:
        _clients.pop(prefix, None)
        return None
    return entry[2]


def _remember(prefix: str, client: APIClient) -> None:
    ttl = settings.API_KEY_CACHE_SECONDS
    if ttl <= 0:
        return
    if len(_clients) >= _MAX_CACHED:
        _clients.clear()
    now = _cache_clock()
    _clients[prefix] = (now, now + ttl, client)


@receiver([post_save, post_delete], sender=APIClient, dispatch_uid="api-key-cache-forget")
def forget_client(sender, instance: APIClient, **kwargs) -> None:
    """A client saved or deleted in this process is read again on its next request."""
    _clients.pop(instance.prefix, None)


class IsApiClient(permissions.BasePermission):
    """Allows only requests authenticated with a valid API key."""

    message = "Authenticate with the header `Authorization: Api-Key <key>`."

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, APIClient)


def required_scope(view, method: str) -> str | None:
    """The scope ``view`` declares for ``method`` (``HEAD`` as ``GET``, ``OPTIONS`` needs ``read``), or None."""
    method = method.lower()
    if method == "options":
        return Scope.READ
    declared = getattr(view, "required_scopes", None) or {}
    return declared.get("get" if method == "head" else method)


def implements(view, method: str) -> bool:
    """Whether ``view`` has a handler for ``method`` (``HEAD`` where it has ``GET``; ``OPTIONS``: DRF's)."""
    method = method.lower()
    return method in view.http_method_names and hasattr(view, method)


class HasRequiredScope(permissions.BasePermission):
    """Allows a request only if its API key holds the scope the view declares for the method.

    A method the view does not implement is left to DRF's own answer, whatever the key holds:
    raises MethodNotAllowed (405 ``method_not_allowed``, with ``Allow``), as DRF's dispatch would
    after the permissions. For an implemented method, raises MissingScope (403 ``missing_scope``,
    field ``Authorization``), or PermissionDenied (``no_scope_declared``) when the view declares no
    scope for it (fail closed)."""

    def has_permission(self, request, view) -> bool:
        if not implements(view, request.method):
            raise exceptions.MethodNotAllowed(request.method)
        scope = required_scope(view, request.method)
        if scope is None:
            raise exceptions.PermissionDenied(f"{request.method} on this endpoint declares no scope: refused",
                                              code="no_scope_declared")
        if not request.auth.has_scope(scope):
            raise MissingScope(scope)
        return True


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents the scheme in the OpenAPI schema (drf-spectacular)."""

    target_class = "notifications.api.auth.ApiKeyAuthentication"
    name = "ApiKeyAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Api-Key <key>`; create a key with `manage.py create_api_client NAME`."}

"""API-key authentication: ``Authorization: Api-Key <key>`` (djangorestframework-api-key), and the
scope each operation needs.

Keys are stored hashed (SHA-512); the lookup is by the key's public prefix, then a constant-time
hash comparison. ``request.auth`` is the :class:`~notifications.models.APIClient`.

Every API view declares the scope of each method it implements::

    class RecipientView(APIView):
        required_scopes = {"get": Scope.READ, "put": Scope.RECIPIENTS_WRITE, "delete": Scope.RECIPIENTS_WRITE}

:class:`HasRequiredScope` (a default permission) refuses a key without it (403 ``missing_scope``) before
the view runs, and refuses a method the view declares no scope for (fail closed);
``tests/test_scopes.py`` walks every URL pattern so an endpoint cannot forget its declaration.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework_api_key.permissions import KeyParser

from notifications.api.refusals import MissingScope
from notifications.models import APIClient
from notifications.scopes import Scope


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
        try:
            client = APIClient.objects.get_from_key(key)
        except APIClient.DoesNotExist:
            raise exceptions.AuthenticationFailed("unknown API key", code="invalid_api_key") from None
        if client.revoked or client.has_expired:
            raise exceptions.AuthenticationFailed("this API key is revoked or expired", code="revoked_api_key")
        return (None, client)

    def authenticate_header(self, request) -> str:
        return self.keyword


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


class HasRequiredScope(permissions.BasePermission):
    """Allows a request only if its API key holds the scope the view declares for the method.

    Raises MissingScope (403 ``missing_scope``, field ``Authorization``), or PermissionDenied
    (``no_scope_declared``) for a method without a declared scope."""

    def has_permission(self, request, view) -> bool:
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

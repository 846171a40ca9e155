"""The API's 403s about what a key may do, as exceptions (formatted by
:func:`core.api.errors.exception_handler` in the one error shape).

Kept apart from :mod:`core.api.errors` because the authentication and permission classes
raise them, and those are imported while DRF itself is still loading (``rest_framework.views``).
"""

from __future__ import annotations

import math

from rest_framework import exceptions


class MissingScope(exceptions.PermissionDenied):
    """403 ``missing_scope``: the API key lacks ``scope``. ``field`` names what needed it:
    ``Authorization`` (the operation itself) or the request field that asked for more (``priority``).

    Answered as ``{"error": {"status": 403, "code": "missing_scope", "message": "Authorization: this API
    key lacks the scope recipients:write", "fields": [{"field": "Authorization", "code": "missing_scope",
    "message": "this API key lacks the scope recipients:write"}]}}``.
    """

    def __init__(self, scope: str, field: str = "Authorization", why: str = "") -> None:
        super().__init__(f"this API key lacks the scope {scope}" + (f" ({why})" if why else ""), code="missing_scope")
        self.scope = scope
        self.field = field


class NotOwner(exceptions.PermissionDenied):
    """403 ``not_owner`` naming the path field of an object that belongs to another API client (or was
    made in the admin): ``NotOwner("segment_id", "this segment belongs to another API client")``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, code="not_owner")
        self.field = field


class AcceptanceLimited(exceptions.Throttled):
    """429 ``acceptance_limited``: an abuse limit at acceptance (docs/POLICIES.md) refused the request.
    ``limit`` is the rule's name, ``user_id`` the (first) limited recipient, ``wait`` the seconds
    until a slot frees (the ``Retry-After`` header). Answered as ``{"error": {"status": 429, "code":
    "acceptance_limited", "limit": "otp_per_user", "retry_after": 42, "message": "user_id: …",
    "fields": [{"field": "user_id", "code": "acceptance_limited", "message": "…"}]}}``."""

    default_code = "acceptance_limited"

    def __init__(self, limit: str, user_id: str, wait: float, message: str) -> None:
        exceptions.APIException.__init__(self, message)  # not Throttled's: its text names the wait again
        self.wait = math.ceil(max(1.0, wait))
        self.limit = limit
        self.user_id = user_id
        self.field = "user_id"  # the request's field that named them (``user_ids.3`` for a list)


class AcceptanceLimitsUnavailable(exceptions.APIException):
    """503 ``acceptance_limits_unavailable``: a request an abuse limit applies to, while the store
    of its windows (Redis) cannot be reached: refused rather than accepted unlimited."""

    status_code = 503
    default_code = "acceptance_limits_unavailable"
    default_detail = ("the abuse limits of this request cannot be checked (Redis unreachable); nothing was "
                      "written: retry shortly")


class Busy(exceptions.APIException):
    """503 ``code``: a bounded resource of this process stayed taken (``template_checks_busy``: the
    slots of template checking); nothing was written. ``wait`` seconds go out as ``Retry-After``
    (DRF's handler sets it from ``wait``). Answered as ``{"error": {"status": 503, "code": code,
    "message": message}}``."""

    status_code = 503
    default_code = "busy"

    def __init__(self, code: str, message: str, wait: int) -> None:
        super().__init__(message, code=code)
        self.wait = wait

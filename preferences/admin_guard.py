"""Admin hardening shared by every app's admin pages (DESIGN.md §10).

* :class:`ContentLookupGuard`, a ModelAdmin mixin: no changelist lookup and no search may reach a
  field that holds message content, for any staff user, superusers included. A model names its
  content-bearing fields in a class attribute ``content_fields`` (a frozenset of field names:
  ``Notification.content_fields`` holds title, body, html, data, …). Otherwise
  ``?id=<id>&body__startswith=Your+code+is+1`` answers "1 result" or "0 results" and reads a hidden
  OTP code one digit at a time. A refused lookup is Django's ``DisallowedModelAdminLookup`` (a
  SuspiciousOperation): the answer is 400 and no count is rendered.
  ``check()`` (run by ``manage.py check``) fails, id ``admin_guard.E001``, for a ``search_fields``
  entry that reaches content.

This module imports Django only, so the admins of every floor (preferences, notifications, campaigns)
can use it.
"""

from __future__ import annotations

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db.models.constants import LOOKUP_SEP

_SEARCH_PREFIXES = "^=@"


def content_field_of(model, lookup: str) -> str | None:
    """The content field that ``lookup`` (``"body__startswith"``, ``"recipient__notifications__data__otp"``)
    reaches from ``model``, as ``"app_label.Model.field"``; ``None`` when it reaches none.

    Follows relations (forward and reverse) part by part; stops at the first part that is not a
    field (a transform or lookup name such as ``startswith``). ``pk`` is the primary key.
    """
    for part in lookup.split(LOOKUP_SEP):
        opts = model._meta
        name = opts.pk.name if part == "pk" else part
        try:
            field = opts.get_field(name)
        except FieldDoesNotExist:
            return None
        if field.name in getattr(model, "content_fields", ()):
            return f"{opts.app_label}.{opts.object_name}.{field.name}"
        related = getattr(field, "related_model", None)
        if not field.is_relation or related is None:
            return None
        model = related
    return None


class ContentLookupGuard:
    """ModelAdmin mixin (put it before ``admin.ModelAdmin``): lookups and searches never reach content.
    See the module docstring."""

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        if content_field_of(self.model, lookup) is not None:
            return False
        return super().lookup_allowed(lookup, value, request)

    def check(self, **kwargs) -> list[checks.CheckMessage]:
        errors = list(super().check(**kwargs))
        for term in self.search_fields or ():
            reached = content_field_of(self.model, str(term).lstrip(_SEARCH_PREFIXES))
            if reached is not None:
                errors.append(checks.Error(
                    f"search_fields entry {term!r} searches message content ({reached}).",
                    hint="Search by ids and contacts only; content is never searchable in the admin.",
                    obj=self.__class__, id="admin_guard.E001"))
        return errors

"""Admin hardening shared by every app's admin pages (docs/ARCHITECTURE.md §10).

:class:`ContentLookupGuard`, a ModelAdmin mixin: no changelist lookup or search may reach a field
named in the model's ``content_fields`` (message content, or a secret such as an API client's key
hash), for any staff user, or ``?body__startswith=`` would read a hidden OTP one digit at a time.
A refused lookup is 400 (``DisallowedModelAdminLookup``), as is a filter value that cannot apply;
``check()`` fails (``admin_guard.E001``) for a ``search_fields`` entry that reaches content.
:func:`install` (``config/urls.py``) answers 400 to a NUL byte anywhere in an admin request (was a
500). The rules for staff: docs/SECURITY.md, docs/OPERATIONS.md "The admin, page by page".
Imports Django only, so the admins of every floor can use it.
"""

from __future__ import annotations

import functools

from django.contrib.admin.options import IncorrectLookupParameters
from django.core import checks
from django.core.exceptions import BadRequest, FieldDoesNotExist
from django.db.models.constants import LOOKUP_SEP

_SEARCH_PREFIXES = "^=@"


def content_field_of(model, lookup: str) -> str | None:
    """The content field that ``lookup`` (``"body__startswith"``, ``"recipient__notifications__data__otp"``)
    reaches from ``model``, as ``"app_label.Model.field"``; ``None`` when it reaches none.

    Follows relations (forward and reverse) part by part; stops at the first part that is not a
    field (a transform or lookup name such as ``startswith``). ``pk`` is the primary key. A lookup
    that ends on a foreign key (``client``, ``client__startswith``) compares the field it points to.
    """
    parts = lookup.split(LOOKUP_SEP)
    for index, part in enumerate(parts):
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
        target = getattr(field, "target_field", None)
        following = parts[index + 1] if index + 1 < len(parts) else None
        if target is not None and field.many_to_one and not _is_field(model, following):
            return content_field_of(model, target.name)
    return None


def _is_field(model, name: str | None) -> bool:
    if name is None:
        return False
    try:
        model._meta.get_field(model._meta.pk.name if name == "pk" else name)
    except FieldDoesNotExist:
        return False
    return True


class ContentLookupGuard:
    """ModelAdmin mixin (put it before ``admin.ModelAdmin``): lookups and searches never reach content,
    and a filter value that cannot be applied answers 400. See the module docstring."""

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        own = {getattr(f, "parameter_name", None) for f in self.list_filter if isinstance(f, type)}
        if lookup not in own and content_field_of(self.model, lookup) is not None:
            return False  # (a SimpleListFilter's parameter is its own queryset's, never a lookup)
        return super().lookup_allowed(lookup, value, request)

    def get_changelist_instance(self, request):
        """The changelist; raises BadRequest (400) for a filter Django could not apply (a malformed
        id, a value of the wrong type) instead of Django's redirect to the unfiltered list. A page
        number past the end keeps Django's redirect (the exception carries no cause then)."""
        try:
            return super().get_changelist_instance(request)
        except IncorrectLookupParameters as exc:
            if not exc.args and exc.__cause__ is None:
                raise
            raise BadRequest(f"This filter cannot be applied: {exc}") from exc

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


def nul_problem(request, view_args=(), view_kwargs=None) -> str:
    """Where a NUL byte is in ``request`` (path, URL arguments, query or form keys and values):
    ``"the path"``, ``"the query"``, ``"the form"``, or ``''`` for none."""
    arguments = [*view_args, *(view_kwargs or {}).values()]
    if "\x00" in request.path or any("\x00" in str(value) for value in arguments):
        return "the path"
    sources = [("the query", request.GET)] + ([("the form", request.POST)] if request.method == "POST" else [])
    for where, params in sources:
        for key, values in params.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return where
    return ""


def install(site) -> None:
    """Make every view of the admin ``site`` answer 400 (BadRequest) to a request carrying a NUL byte
    (see :func:`nul_problem`), before the view runs. Idempotent; call before serving requests."""
    if getattr(site, "_nul_guard_installed", False):
        return
    site_admin_view = site.admin_view

    def admin_view(view, cacheable=False):
        inner = site_admin_view(view, cacheable)

        @functools.wraps(inner)
        def guarded(request, *args, **kwargs):
            where = nul_problem(request, args, kwargs)
            if where:
                raise BadRequest(f"A NUL character in {where}.")
            return inner(request, *args, **kwargs)

        return guarded

    site.admin_view = admin_view
    site._nul_guard_installed = True

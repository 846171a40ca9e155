"""What an API write changed, noted by the view for the audit log (field names only, never values).

A view calls :func:`note_changes` (before/after representations) or :func:`note_fields`; the
notifications app's ``AuditMiddleware`` (notifications/audit.py) reads ``request.audit_fields`` after
the answer and stores the entry. Kept on the ground floor so every app's API notes the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

_EMPTY: tuple[object, ...] = ("", None, [], {})


def changed_fields(before: Mapping | None, after: Mapping) -> list[str]:
    """The keys whose values differ between two representations, sorted; a dict value is compared
    key by key (``attributes.first_name``). ``before=None`` (created): the keys ``after`` sets.

    >>> changed_fields({"phone": "+491", "attributes": {"a": "x"}}, {"phone": "+492", "attributes": {"a": "y"}})
    ['attributes.a', 'phone']
    """
    if before is None:
        return sorted(k for k, v in after.items() if v not in _EMPTY)
    out: list[str] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if isinstance(old, Mapping | type(None)) and isinstance(new, Mapping | type(None)):
            old, new = old or {}, new or {}
            subkeys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            out.extend(f"{key}.{k}" for k in subkeys)
        else:
            out.append(key)
    return out


def _django_request(request):
    return getattr(request, "_request", request)  # a DRF Request wraps Django's


def note_fields(request, fields: Iterable[str]) -> None:
    """Names what this write changed (field names only; never values)."""
    _django_request(request).audit_fields = sorted(set(fields))


def note_changes(request, before: Mapping | None, after: Mapping) -> None:
    """:func:`note_fields` with the :func:`changed_fields` of two representations of the object."""
    note_fields(request, changed_fields(before, after))

"""Keyset (cursor) pagination for the API's list endpoints: ``{"items": [...], "next_cursor": …}``.

The cursor is the last item's sort key, signed and bound to its listing (:mod:`core.cursors`);
the next page is the rows strictly after it, found by an index range scan (no OFFSET), so deep
pages cost what page 1 does and rows written meanwhile never shift a page. ``limit`` and
``cursor`` plus each list's own filters; anything else, a bad value or a foreign cursor is a 422
naming the parameter, before any query runs. The client's view: docs/API.md, "Lists (pagination)".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from core import cursors
from core.api.errors import InvalidParameter
from core.api.fields import nearest
from core.api.parameters import IdRule
from core.api.parsers import unstorable

DEFAULT_LIMIT = 50
MAX_LIMIT = 200


class QueryError(InvalidParameter):
    """A bad query parameter (a 422 naming it): codes ``unknown_parameter``, ``invalid``,
    ``invalid_choice``, ``min_value``, ``max_value``, ``invalid_cursor``."""


@dataclass(frozen=True)
class Ordering:
    """A list's order: model field names, most significant first, all ascending or all descending.
    The last field must be unique (the primary key) so the order is total."""

    fields: tuple[str, ...]
    descending: bool = False

    def order_by(self) -> list[str]:
        return [f"-{f}" if self.descending else f for f in self.fields]

    def after(self, values: Sequence) -> Q:
        """Rows strictly after the row whose sort key is ``values`` (lexicographic)."""
        op = "lt" if self.descending else "gt"
        q = Q()
        for i, name in enumerate(self.fields):
            term = Q(**{f"{name}__{op}": values[i]})
            for prev, value in zip(self.fields[:i], values[:i], strict=True):
                term &= Q(**{prev: value})
            q |= term
        return q


def encode_cursor(values: Sequence, listing: Sequence[str | None]) -> str:
    """The signed cursor (:mod:`core.cursors`) of the sort key ``values`` in ``listing``."""
    return cursors.sign([v.isoformat() if hasattr(v, "isoformat") else str(v) for v in values], listing)


def decode_cursor(cursor: str, size: int, listing: Sequence[str | None]) -> list[str]:
    """The sort key in ``cursor``. Raises QueryError(``invalid_cursor``) unless :func:`encode_cursor`
    made it for this ``listing``."""
    try:
        values = cursors.unsign(cursor, listing)
    except cursors.BadCursor:
        values = None
    if (not isinstance(values, list) or len(values) != size
            or not all(isinstance(v, str) and not unstorable(v) for v in values)):
        raise QueryError("cursor", "invalid_cursor", "not a cursor from this list's next_cursor")
    return values


def read_query(params, filters: dict[str, Sequence[str] | IdRule], *, default_limit: int = DEFAULT_LIMIT,
               max_limit: int = MAX_LIMIT) -> dict:
    """Validate ``params`` (a QueryDict): ``limit``, ``cursor`` and the given ``filters``
    (``{name: allowed values}``, or ``{name: IdRule}`` for a filter naming an id, such as
    ``segment_id``). Returns ``{"limit": int, "cursor": str | None, <filter>: str…}`` (absent
    filters left out). ``default_limit`` / ``max_limit``: a list's own page sizes (the inbox's).

    Raises:
        QueryError: unknown parameter, repeated parameter, bad limit, value not among the choices.
        InvalidParameter: a filter's value breaks its id rule (code ``invalid``).
    """
    allowed = {"limit", "cursor", *filters}
    for name in params:
        if name not in allowed:
            near = nearest(name, allowed)
            raise QueryError(name, "unknown_parameter", "unknown query parameter; "
                                                       + (f"did you mean {near}? " if near else "")
                                                       + f"this list takes {', '.join(sorted(allowed))}")
        if len(params.getlist(name)) > 1:
            raise QueryError(name, "invalid", "give this parameter at most once")
    out: dict = {"cursor": params.get("cursor") or None}
    raw_limit = params.get("limit", str(default_limit))
    if not (raw_limit.isascii() and raw_limit.isdigit()):  # "²" and "٣" are digits to str.isdigit()
        raise QueryError("limit", "invalid", f"must be a whole number from 1 to {max_limit}")
    out["limit"] = int(raw_limit)
    if out["limit"] < 1:
        raise QueryError("limit", "min_value", "must be at least 1")
    if out["limit"] > max_limit:
        raise QueryError("limit", "max_value", f"must be at most {max_limit}")
    for name, choices in filters.items():
        if name not in params:
            continue
        value = params[name]
        if isinstance(choices, IdRule):
            out[name] = choices.check(name, value)
            continue
        if value not in choices:
            raise QueryError(name, "invalid_choice", f"must be one of {', '.join(choices)}")
        out[name] = value
    return out


def page(qs: QuerySet, ordering: Ordering, *, limit: int, cursor: str | None, listing: Sequence[str | None],
         key: Callable[[object], Sequence] | None = None) -> tuple[list, str | None]:
    """One page of ``qs`` in ``ordering`` after ``cursor``: ``(rows, next_cursor)``; ``next_cursor``
    is None on the last page. ``listing``: what the cursor is bound to (the list's name, the ids and
    filters that define it; :mod:`core.cursors`). ``key(row)`` gives a row's sort values (default:
    the ordering's attributes). Raises QueryError for a cursor that is not this listing's."""
    if cursor:
        values = decode_cursor(cursor, len(ordering.fields), listing)
        try:
            qs = qs.filter(ordering.after(values))
            rows = list(qs.order_by(*ordering.order_by())[:limit + 1])
        except (ValueError, TypeError, DjangoValidationError) as exc:
            raise QueryError("cursor", "invalid_cursor", "not a cursor from this list's next_cursor") from exc
    else:
        rows = list(qs.order_by(*ordering.order_by())[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    if not more or not rows:
        return rows, None
    last = rows[-1]
    values = key(last) if key else [getattr(last, f) for f in ordering.fields]  # type: ignore[assignment]
    return rows, encode_cursor(values, listing)


def list_page(params, qs: QuerySet, ordering: Ordering, items: Callable[[list], list],
              filters: dict[str, Sequence[str] | IdRule] | None = None, *, listing: Sequence[str]) -> dict:
    """A list endpoint's answer, ``{"items": items(rows), "next_cursor": str | None}``: ``params``
    (the request's QueryDict) read by :func:`read_query`, each given filter applied to ``qs`` as
    an equality on the field of the same name, then one :func:`page`. ``listing``: the list's name
    and the path ids that define it (``("segment_members", segment_id)``); the filters' values are
    added, so a cursor only reads on in the listing that gave it. Raises QueryError."""
    filters = filters or {}
    query = read_query(params, filters)
    qs = qs.filter(**{name: query[name] for name in filters if name in query})
    bound = (*listing, *(query.get(name) for name in filters))
    rows, next_cursor = page(qs, ordering, limit=query["limit"], cursor=query["cursor"], listing=bound)
    return {"items": items(rows), "next_cursor": next_cursor}


def page_parameters(**filters: tuple[Sequence[str] | IdRule, str]) -> list[OpenApiParameter]:
    """OpenAPI query parameters: ``limit``, ``cursor`` and ``filters`` (``name=(choices or IdRule,
    description)``)."""
    params = [
        OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
                         OpenApiParameter.QUERY, description=f"Items per page (1–{MAX_LIMIT})."),
        OpenApiParameter("cursor", {"type": "string", "maxLength": 1000}, OpenApiParameter.QUERY,
                         description="`next_cursor` of the previous page; omit for the first page."),
    ]
    for name, (choices, description) in filters.items():
        schema = dict(choices.schema) if isinstance(choices, IdRule) else {"type": "string", "enum": list(choices)}
        params.append(OpenApiParameter(name, schema, OpenApiParameter.QUERY, description=description))
    return params


def page_serializer(name: str, item: serializers.BaseSerializer) -> serializers.Serializer:
    """The documented shape of a page of ``item``: ``{items: [item…], next_cursor}``."""
    from drf_spectacular.utils import inline_serializer

    return inline_serializer(name, fields={
        "items": item.__class__(many=True),
        "next_cursor": serializers.CharField(allow_null=True, help_text="Pass as `cursor` for the next page; "
                                                                         "null on the last page."),
    })

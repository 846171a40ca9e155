"""Signed page cursors: the one rule for every paginated list (:mod:`core.api.pagination`, the inbox's
:mod:`notifications.inbox.listing`).

A cursor is a list's position (the last item's sort key), signed with Django's ``Signer``
(``SECRET_KEY``) and salted with the *listing* it belongs to: the list's name and what defines it (a
segment's, user's or event's id, the status filter…). A made-up cursor, a tampered one or another
listing's does not verify (:class:`BadCursor`), so no query ever runs on what a client wrote.
Plain ``Signer``, not ``signing.dumps``/``TimestampSigner``: a cursor carries no time and never
expires ("load more" an hour later reads the next page). Signed, not encrypted: it reveals the sort
key of an item the client has already seen.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from django.core import signing


class BadCursor(ValueError):
    """A cursor that is not one of this listing's ``next_cursor`` values (tampered, made up, another list's)."""


def _signer(listing: Sequence[str | None]) -> signing.Signer:
    # JSON of the listing's parts: unambiguous (no "a:b" + "c" == "a" + "b:c"), the same for the same listing.
    return signing.Signer(salt=json.dumps(list(listing), separators=(",", ":")))


def sign(position: list, listing: Sequence[str | None]) -> str:
    """The cursor (URL-safe) of ``position`` (a JSON-able list) in ``listing``."""
    return _signer(listing).sign_object(position)


def unsign(cursor: str, listing: Sequence[str | None]) -> list:
    """The position ``cursor`` holds. Raises :class:`BadCursor` unless :func:`sign` made it for this
    ``listing`` with this ``SECRET_KEY`` (and it holds a list)."""
    try:
        value = _signer(listing).unsign_object(cursor)
    except (signing.BadSignature, ValueError, UnicodeError) as exc:
        raise BadCursor("not a next_cursor of this list") from exc
    if not isinstance(value, list):
        raise BadCursor("not a next_cursor of this list")
    return value

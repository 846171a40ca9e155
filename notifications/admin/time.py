"""Instants on admin pages, for support agents comparing a timeline with a user's report or a
provider's log: to the millisecond, in UTC (rendered by the server) and in the viewer's own zone
(added in the browser by ``notifications/admin/instants.js``, from the browser's IANA zone).

:func:`instant` renders one instant; :func:`instant_display` makes a ModelAdmin/inline display
method for a datetime field.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib import admin
from django.utils.html import format_html
from django.utils.safestring import SafeString

#: Admin ``Media`` JavaScript that adds the viewer's local time to every :func:`instant`.
INSTANTS_JS = "notifications/admin/instants.js"
EMPTY = "—"


def instant(value: datetime | None) -> SafeString | str:
    """``<time class="instant" datetime="2030-03-01T09:00:00.123Z">2030-03-01 09:00:00.123 UTC</time>``
    for an aware datetime (milliseconds, UTC); ``—`` for None."""
    if value is None:
        return EMPTY
    at = value.astimezone(UTC)
    millis = f"{at.microsecond // 1000:03d}"
    return format_html('<time class="instant" datetime="{}.{}Z">{}.{} UTC</time>',
                       at.strftime("%Y-%m-%dT%H:%M:%S"), millis, at.strftime("%Y-%m-%d %H:%M:%S"), millis)


def instant_display(field: str, description: str):
    """A display method (``obj -> instant(obj.<field>)``) for ``readonly_fields``/``list_display``,
    sortable by ``field``."""

    @admin.display(description=description, ordering=field)
    def show(self, obj):
        return instant(getattr(obj, field))

    show.__name__ = f"{field}_instant"
    return show

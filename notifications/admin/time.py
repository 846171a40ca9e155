"""Instants on admin pages, for support agents comparing a timeline with a user's report or a
provider's log: to the millisecond, in UTC (rendered by the server) and in the viewer's own zone
(added in the browser by ``notifications/admin/instants.js``, from the browser's IANA zone).

:func:`instant` renders one instant; :func:`instant_display` makes a ModelAdmin/inline display
method for a datetime field; :class:`PlatformDateFilter` is Django's date filter on the platform clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from core import clock

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


class PlatformDateFilter(admin.DateFieldListFilter):
    """Django's date filter (Today, Past 7 days, This month, This year) for a datetime stamped on the
    platform clock (:func:`core.clock.now`, which tests and e2e move): Django's counts the days from the
    host's clock, so with the clock moved "Today" listed another day's rows."""

    def __init__(self, field, request, params, model, model_admin, field_path):
        super().__init__(field, request, params, model, model_admin, field_path)
        today = timezone.localtime(clock.now()).replace(hour=0, minute=0, second=0, microsecond=0)
        tomorrow = today + timedelta(days=1)
        month = today.replace(day=1)
        next_month = (month + timedelta(days=32)).replace(day=1)
        year = today.replace(month=1, day=1)
        since, until = self.lookup_kwarg_since, self.lookup_kwarg_until
        self.links = ((_("Any date"), {}), (_("Today"), {since: today, until: tomorrow}),
                      (_("Past 7 days"), {since: today - timedelta(days=7), until: tomorrow}),
                      (_("This month"), {since: month, until: next_month}),
                      (_("This year"), {since: year, until: year.replace(year=year.year + 1)}),
                      *self.links[5:])  # "No date" / "Has date" of a nullable field, as Django's

"""A recipient's last 30 days at a glance, on their admin page (issue 27 part 3; docs/OPERATIONS.md,
"Support"): every notification as a dot by channel and outcome (the reason on hover), and the same
as a table per channel, which is all there is with JavaScript off. For support: "did she get
anything from us this week?" is one look.

One bounded read (:func:`window_rows`): the recipient's newest :data:`MAX_POINTS` notifications
that happened in the window, live and archived, each placed at when it happened (sent, else made).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce

from core import clock
from notifications import records
from notifications.admin.base import ReadOnly, ReadOnlyFormSet
from notifications.models import Notification, NotificationRecord

DAYS = 30
MAX_POINTS = 2000
#: Outcome groups, in the order the table and the legend show them: status → group.
GROUPS = {"delivered": ("delivered", "displayed", "dismissed", "opened"), "sent": ("sent",),
          "failed": ("failed",), "suppressed": ("suppressed",), "not sent": ("expired", "cancelled"),
          "pending": ("scheduled", "queued", "sending")}
GROUP_OF = {status: group for group, statuses in GROUPS.items() for status in statuses}
CHANNELS = ("push", "email", "sms", "in_app")


def timeline(recipient_id: str, now: datetime | None = None) -> dict:
    """``{"points": [{t, channel, group, status, reason}], "table": [(channel, {group: n}, last
    delivered or sent)], "truncated": bool, "since": datetime, "shown_since": datetime | None}`` over the
    last :data:`DAYS` days; truncated, the chart and the table hold only the newest :data:`MAX_POINTS`."""
    now = now or clock.now()
    since = now - timedelta(days=DAYS)
    rows = list(window_rows(recipient_id, since)[:MAX_POINTS + 1])
    truncated = len(rows) > MAX_POINTS
    rows = rows[:MAX_POINTS]
    points = [{"t": int(at.timestamp() * 1000), "channel": channel, "group": GROUP_OF.get(status, "pending"),
               "status": status, "reason": reason or ""} for _pk, at, channel, status, reason in rows]
    counts: dict[str, Counter] = {}
    last_reached: dict[str, datetime] = {}
    for _pk, at, channel, status, _reason in rows:
        counts.setdefault(channel, Counter())[GROUP_OF.get(status, "pending")] += 1
        if GROUP_OF.get(status) in ("delivered", "sent"):
            last_reached[channel] = max(at, last_reached.get(channel, at))
    channels = [c for c in CHANNELS if c in counts] + sorted(set(counts) - set(CHANNELS))
    table = [(c, [counts[c][g] for g in GROUPS], last_reached.get(c)) for c in channels]
    return {"points": points, "table": table, "groups": list(GROUPS), "channels": channels,
            "chart": {"points": points, "channels": channels, "groups": list(GROUPS),
                      "since": int(since.timestamp() * 1000), "until": int(now.timestamp() * 1000)},
            "truncated": truncated, "since": since, "days": DAYS, "max_points": MAX_POINTS,
            "max_points_text": f"{MAX_POINTS:,}",
            # Truncated: the oldest instant the shown rows reach, so the page says what they cover.
            "shown_since": min(at for _pk, at, *_rest in rows) if truncated else None}


def window_rows(recipient_id: str, since: datetime) -> QuerySet[NotificationRecord, tuple]:
    """``(pk, at, channel, status, reason)`` of the recipient's notifications that happened at or after
    ``since``, newest made first; ``at``: when it was sent, else when it was made (a send scheduled
    weeks ahead lands on its day).

    Selected by ``at`` in SQL, and bounded by ``archived_at``, not ``created_at``: a history row was
    archived after its last change (``HOT_HOURS`` after it, by the archiver; ``sent_at`` is written only
    while a row is live), so ``at <= archived_at`` and only the day partitions archived since ``since``
    can hold one (the others are pruned); the live table holds only rows still moving or finished
    within ``HOT_HOURS`` (dead letters ``DEAD_LETTER_DAYS``). Each is read by its ``(recipient,
    created_at)`` index (tests/test_history_plans.py). A bound on ``created_at`` (``since`` minus the
    API's 366-day scheduling horizon) would prune no partition and miss a send deferred past it (a
    quiet-hours deferral, a dead letter replayed days later)."""
    return (records.records().filter(Q(archived_at__isnull=True) | Q(archived_at__gte=since),
                                     recipient_id=recipient_id)
            .annotate(at=Coalesce("sent_at", "created_at")).filter(at__gte=since).order_by("-created_at")
            .values_list("pk", "at", "channel", "status", "reason"))


class _TimelineFormSet(ReadOnlyFormSet):
    @classmethod
    def get_default_prefix(cls) -> str:
        # Its own prefix: the notification list (the same model) keeps "notifications", which the
        # recipient form's saves post.
        return "recipient_timeline"


class RecipientTimelineInline(ReadOnly, admin.TabularInline):
    """The timeline above the recipient's notification list; for those who may read notifications
    (support), as that list. No row of its own: its template draws :func:`timeline`."""

    model = Notification
    formset = _TimelineFormSet  # a save of the recipient's form never expects this one's management form
    template = "admin/notifications/recipient/timeline.html"
    verbose_name_plural = f"Last {DAYS} days"
    extra = 0
    max_num = 0

    def get_queryset(self, request):
        return super().get_queryset(request).none()

    def get_fields(self, request, obj=None):
        # No field of its own: without this, Django builds a formset (and so read the timeline) only to
        # learn the form's fields, a second read of the window per page (hadv34 #11).
        return []

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.timeline = timeline(obj.pk) if obj is not None else None
        return formset

"""The in-app inbox's rows (docs/APP.md): :class:`InboxItem`, one per ``in_app`` notification, and
:class:`InboxCounts`, a user's badge numbers kept in step with the items in the same transaction.

Registered by :meth:`notifications.apps.NotificationsConfig.import_models`; import them from this
module."""

from __future__ import annotations

from django.db import models

from core import clock
from notifications.models import Notification
from preferences.models import Recipient


class InboxItem(models.Model):
    """One notification in a user's in-app inbox: what the app shows (rendered when it was "sent",
    i.e. written here) and the user's state of it.

    The primary key is the notification's id, so the pipeline writes an item at most once however
    often a row is re-driven (``INSERT … ON CONFLICT DO NOTHING``, :func:`notifications.inbox.store.write`).
    ``created_at``: when it was written (UTC, the platform clock), the listing's order (newest first,
    ties broken by id). ``seen_at`` / ``read_at`` / ``archived_at``: the user's state (UTC), set by
    ``POST /v1/users/{id}/inbox/mark``; ``expires_at``: the notification's TTL (hidden after it,
    pruned later)."""

    #: What the item says: never filtered or searched in the admin (preferences.admin_guard).
    content_fields = frozenset({"title", "body", "data"})

    # No FK constraint: the notification may be archived to the history while its item stays.
    notification = models.OneToOneField(Notification, on_delete=models.CASCADE, primary_key=True,
                                        related_name="inbox_item", db_constraint=False)
    # No FK index of its own: the listing indexes below lead with it.
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="inbox_items", db_index=False)
    type_key = models.CharField(max_length=64, blank=True, default="", help_text="Its notification type, if any.")
    category = models.CharField(max_length=64, blank=True, default="")
    title = models.CharField(max_length=998, blank=True, default="")
    body = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    seen_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "inbox item"
        indexes = [
            # The listing (keyset pagination, newest first): one partial index per status filter, so
            # a page of a user with a million items reads only that page (docs/APP.md).
            models.Index(fields=["recipient", "-created_at", "-notification"], name="inbox_all_idx",
                         condition=models.Q(archived_at__isnull=True)),
            models.Index(fields=["recipient", "-created_at", "-notification"], name="inbox_unread_idx",
                         condition=models.Q(archived_at__isnull=True, read_at__isnull=True)),
            models.Index(fields=["recipient", "-created_at", "-notification"], name="inbox_unseen_idx",
                         condition=models.Q(archived_at__isnull=True, seen_at__isnull=True)),
            models.Index(fields=["recipient", "-created_at", "-notification"], name="inbox_archived_idx",
                         condition=models.Q(archived_at__isnull=False)),
            models.Index(fields=["recipient", "category", "-created_at", "-notification"],
                         name="inbox_category_idx", condition=models.Q(archived_at__isnull=True)),
            # Pruning: items past their TTL, and items past the retention period.
            models.Index(fields=["expires_at"], name="inbox_expires_idx", condition=models.Q(expires_at__isnull=False)),
            models.Index(fields=["created_at"], name="inbox_created_idx"),
        ]

    def __str__(self) -> str:
        return f"inbox item {self.pk} for {self.recipient_id}"


class InboxCounts(models.Model):
    """A user's badge numbers (``GET /v1/users/{id}/inbox/counts``), one row per user with an inbox,
    changed in the same transaction as the items they count, so reading them is one primary-key
    lookup however big the inbox: ``total`` items not archived, ``unread`` of them not read,
    ``unseen`` of them not seen. Items past their TTL still count until the prune removes them
    (within ``NOTIFY["INBOX"]["PRUNE_EVERY_SECONDS"]``)."""

    recipient = models.OneToOneField(Recipient, on_delete=models.CASCADE, primary_key=True,
                                     related_name="inbox_counts")
    total = models.IntegerField(default=0)
    unread = models.IntegerField(default=0)
    unseen = models.IntegerField(default=0)

    class Meta:
        verbose_name = "inbox counts"
        verbose_name_plural = "inbox counts"

    def __str__(self) -> str:
        return f"{self.recipient_id}: {self.unseen} unseen, {self.unread} unread, {self.total}"

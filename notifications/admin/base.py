"""What every admin page of the pipeline shares: the hidden-content marker, the paginator that
never counts the whole table, and the read-only mixins (the pipeline writes these records; the
admin reads them)."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connection
from django.forms.models import BaseInlineFormSet
from django.utils.functional import cached_property

from notifications import records
from notifications.models import NotificationRecord

HIDDEN = "•••• (sensitive: hidden)"


class EstimatedCountPaginator(Paginator):
    """Pagination without ``COUNT(*)`` over the whole notifications table: an unfiltered list uses
    Postgres' own row estimate (``pg_class.reltuples``), which is instant on 10 million rows; a
    filtered or searched list (a recipient, a status) is counted exactly, through its index."""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            if query.model is NotificationRecord:  # a view: its tables' estimates (live + history partitions)
                estimate = records.estimated_count()
            else:
                with connection.cursor() as cur:
                    cur.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s",
                                [query.model._meta.db_table])
                    row = cur.fetchone()
                estimate = row[0] if row and row[0] else 0
            if estimate > 100_000:
                return int(estimate)
        return super().count


class ReadOnly:
    """Admin mixin: the records the pipeline writes are read, never added, changed or deleted."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyFormSet(BaseInlineFormSet):
    """A list on a page that is saved for other reasons (the recipient's preferences): never bound
    to the POST, always valid, saves nothing (so a POST without its management form is fine)."""

    def __init__(self, data=None, files=None, *args, **kwargs) -> None:
        super().__init__(None, None, *args, **kwargs)

    def is_valid(self) -> bool:
        return True

    def save(self, commit=True):
        self.new_objects, self.changed_objects, self.deleted_objects = [], [], []
        return []

"""Content of the load stage: typed rows are rendered at send time from their type's templates
(:mod:`notifications.events.content`); a campaign's rows by the *content source* the campaigns app
registers (:func:`register_content_source`, in ``CampaignsConfig.ready()``), so the pipeline never
imports the floor above (docs/ARCHITECTURE.md §3).

A source is a class instantiated once per batch with ``render(n) -> (title, body, html, data,
options)`` (``options``: the row's :class:`~notifications.events.content.SendOptions` or ``None``;
raises :class:`ContentError`, which dead-letters the row as ``template_error``) and
``cancelled(n) -> bool`` (the row's campaign was cancelled: checked at send time).
"""

from __future__ import annotations

from collections.abc import Callable

from notifications.events.content import SendOptions, TypeContent
from notifications.models import Notification
from notifications.rendering import RenderError


class ContentError(Exception):
    """The content of a notification could not be rendered (its message says why)."""


_sources: list[Callable] = []


def register_content_source(factory: Callable) -> None:
    """Register the content source for notifications with a ``campaign_id`` (one; a later
    registration replaces an earlier one, e.g. a test's)."""
    _sources[:] = [factory]


class Content:
    """The content of one batch: typed rows from their types (loaded once per batch), campaign rows
    from the registered source (built when first needed: a batch without campaign rows builds
    nothing)."""

    def __init__(self) -> None:
        self._source = None
        self.types = TypeContent()

    def needs_render(self, n: Notification) -> bool:
        """Whether ``n``'s content is made at send time (typed and campaign rows)."""
        return bool(n.notification_type_id or n.campaign_id)

    def _get(self):
        if self._source is None:
            if not _sources:
                raise ContentError("no content source is registered for campaign notifications")
            self._source = _sources[0]()
        return self._source

    def apply(self, n: Notification) -> SendOptions | None:
        """Render ``n``'s content into it (in memory) and return its send options (a typed row's,
        a typed campaign's; ``None``: none). Raises :class:`ContentError`."""
        if n.notification_type_id and not n.campaign_id:
            try:
                return self.types.render(n)
            except RenderError as exc:
                raise ContentError(str(exc)) from exc
        n.title, n.body, n.html, n.data, options = self._get().render(n)
        return options

    def cancelled(self, n: Notification) -> bool:
        """Whether ``n``'s campaign was cancelled (as loaded for this batch)."""
        return bool(n.campaign_id) and self._get().cancelled(n)

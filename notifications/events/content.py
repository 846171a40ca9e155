"""Send-time content of typed notifications (docs/TYPES.md): the type's template for the row's
channel and the recipient's locale (fallback: exact, language, the type's default locale, any),
rendered with the recipient and the event's ``data`` (:mod:`notifications.rendering`). Loaded once
per batch: a template fixed after an event was accepted changes what its queued and deferred
notifications say.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from dataclasses import dataclass

from core.identifiers import control_character_problem
from notifications.content_limits import rendered_problem
from notifications.events.digests import Items, items_data
from notifications.events.models import Event, NotificationType
from notifications.models import Notification
from notifications.rendering import RenderError, context_for, pick_variant, render_parts

#: APNs ``apns-collapse-id`` holds at most 64 bytes (Apple, "Sending notification requests to APNs").
MAX_COLLAPSE_KEY_BYTES = 64


@dataclass(frozen=True)
class SendOptions:
    """What a typed notification's provider message carries beside its content: the push collapse
    key (``None``: the notification id), the SMS sender / email From and the email Reply-To
    (``None``: the provider's); ``required``: the type is ``required`` (its email carries no
    unsubscribe link, notifications.unsubscribe)."""

    collapse_key: str | None = None
    sender: str | None = None
    reply_to: str | None = None
    required: bool = False


class TypeContent:
    """The types and events of one batch, loaded on first use (two queries per batch)."""

    def __init__(self) -> None:
        self._types: dict[str, NotificationType] = {}
        self._templates: dict[tuple[str, str], list] = {}
        self._events: dict = {}
        self._items: dict = {}

    def prime(self, rows: list[Notification]) -> None:
        """Load the types (with their templates) and events of ``rows`` not loaded yet."""
        keys = {n.notification_type_id for n in rows if n.notification_type_id} - set(self._types)
        if keys:
            for kind in NotificationType.objects.filter(pk__in=keys).prefetch_related("templates"):
                self._types[kind.pk] = kind
                grouped = defaultdict(list)
                for template in kind.templates.all():
                    grouped[template.channel].append(template)
                for channel, templates in grouped.items():
                    self._templates[(kind.pk, channel)] = templates
        events = {n.event_id for n in rows if n.event_id} - set(self._events)
        if events:
            self._events.update(Event.objects.only("id", "data", "collapse_key").in_bulk(list(events)))
        digests = {n.digest_id for n in rows if n.digest_id} - set(self._items)
        if digests:
            self._items.update(items_data(digests))

    def type_of(self, n: Notification) -> NotificationType | None:
        if not n.notification_type_id:
            return None
        if n.notification_type_id not in self._types:
            self.prime([n])
        return self._types.get(n.notification_type_id)

    def render(self, n: Notification) -> SendOptions:
        """Render ``n``'s content into it (title, body, html, push data) from its type and event,
        and return its :class:`SendOptions`. Raises RenderError (the type is gone, it has no template
        for the channel, or the render failed)."""
        kind = self.type_of(n)
        if kind is None:
            raise RenderError(f"notification type {n.notification_type_id} no longer exists")
        if n.digest_id:
            if n.digest_id not in self._items:
                self.prime([n])
            items = self._items.get(n.digest_id) or Items()
            return render_typed(n, kind, self._templates.get((kind.pk, n.channel), []),
                                items.first[0] if items.first else {}, extra=digest_context(items))
        if n.event_id not in self._events:
            self.prime([n])
        event = self._events.get(n.event_id)
        return render_typed(n, kind, self._templates.get((kind.pk, n.channel), []),
                            event.data if event is not None else {}, event.collapse_key if event is not None else "")


def digest_context(items: Items) -> dict:
    """What a digest's templates see beside ``data`` (its first item's data): ``items`` (the events'
    data, in order of acceptance; at most :data:`~notifications.events.digests.MAX_RENDERED_ITEMS`),
    ``count`` (all of them), ``first`` and ``last``."""
    return {"items": items.first, "count": items.total, "first": items.first[0] if items.first else {},
            "last": items.last}


def render_typed(n: Notification, kind: NotificationType, templates: list, data: dict,
                 collapse_key: str = "", extra: dict | None = None) -> SendOptions:
    """Render ``n`` (its channel, its recipient's locale) from ``templates`` (the type's templates of
    that channel) with ``data`` as ``{{ data.* }}``, into ``n``; the push collapse key is
    ``collapse_key`` when given, else the type's template rendered, else the notification id (one
    longer than APNs' 64 bytes, or holding a control character, is replaced by a hash of it). Used
    by events and by campaigns that use a type's templates; ``extra``: more variables (a digest's,
    :func:`digest_context`). Raises RenderError."""
    variant = pick_variant(templates, n.recipient.locale, kind.default_locale)
    if variant is None:
        raise RenderError(f"type {kind.key} has no {n.channel} template")
    if kind.sensitive:
        n.sensitive = True  # a type made sensitive after acceptance: what it renders is hidden too
    parts = {"title": variant.title, "body": variant.body, "html": variant.html}
    parts.update({f"data.{k}": v for k, v in (variant.data or {}).items()})
    if n.channel == "push" and kind.collapse_key and not collapse_key:
        parts["collapse_key"] = kind.collapse_key
    out = render_parts(parts, {**context_for(n.recipient, data or {}), **(extra or {})})
    n.title, n.body, n.html = out["title"], out["body"], out["html"]
    n.data = {k[5:]: v for k, v in out.items() if k.startswith("data.")} or None
    collapse = collapse_key or out.get("collapse_key") or None
    if collapse and (len(collapse.encode()) > MAX_COLLAPSE_KEY_BYTES or control_character_problem(collapse)):
        # Too long for APNs, or a control character (a header value): the same key, as a hash.
        collapse = "ck-" + hashlib.sha256(collapse.encode()).hexdigest()[:40]
    sender = kind.sms_from if n.channel == "sms" else kind.email_from if n.channel == "email" else ""
    return SendOptions(collapse_key=collapse if n.channel == "push" else None, sender=sender or None,
                       reply_to=(kind.email_reply_to or None) if n.channel == "email" else None,
                       required=bool(kind.required))


@dataclass(frozen=True)
class ChannelPreview:
    """One channel of :func:`preview`: the variant chosen (its ``locale``; ``""`` when the channel has
    none), the rendered ``title``, ``body``, ``html`` and push ``data`` (``None``: none), the
    :class:`SendOptions` a send would carry, or ``error`` (the RenderError's text) and no content."""

    locale: str = ""
    title: str = ""
    body: str = ""
    html: str = ""
    data: dict | None = None
    options: SendOptions | None = None
    error: str = ""


def preview(kind: NotificationType, recipient, data: dict) -> dict[str, ChannelPreview]:
    """What an event of ``kind`` with ``data`` (a JSON object) would send ``recipient`` on each of the
    type's channels, rendered now by the send-time code (:func:`render_typed`: the same locale
    fallback, escaping and render bounds): ``{channel: ChannelPreview}`` in the type's channel order.
    A render error, or rendered text over the channel's send-time limits
    (:func:`notifications.content_limits.rendered_problem`), is that channel's ``error``; it raises
    nothing. Reads ``kind.templates`` (saved templates, one query unless prefetched); writes nothing
    (the notification it renders is never saved)."""
    variants: dict[str, list] = defaultdict(list)
    for template in kind.templates.all():
        variants[template.channel].append(template)
    out = {}
    for channel in kind.channels:
        n = Notification(id=uuid.uuid4(), recipient=recipient, channel=channel, priority=kind.priority,
                         category=kind.category, sensitive=kind.sensitive, notification_type=kind)
        templates = variants.get(channel, [])
        chosen = pick_variant(templates, recipient.locale, kind.default_locale)
        try:  # a digest type's preview: a digest of this one event
            one = digest_context(Items([data], data, 1)) if kind.digest else None
            options = render_typed(n, kind, templates, data, extra=one)
        except RenderError as exc:
            out[channel] = ChannelPreview(locale=chosen.locale if chosen else "", error=str(exc))
            continue
        problem = rendered_problem(channel, n.title, n.body, n.html, n.data)
        if problem:  # what the send would make a template_error dead letter (content_limits)
            out[channel] = ChannelPreview(locale=chosen.locale, error=problem)
            continue
        out[channel] = ChannelPreview(locale=chosen.locale, title=n.title, body=n.body, html=n.html, data=n.data,
                                      options=options)
    return out

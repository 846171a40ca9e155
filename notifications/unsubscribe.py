"""Which emails carry a one-click unsubscribe link, and the link (RFC 8058; docs/TYPES.md,
"Unsubscribe", which has the rule's table and why).

The load stage asks :func:`carries_unsubscribe`; the providers put the link in the
``List-Unsubscribe`` headers (``providers.base.unsubscribe_headers``); the token and the opt-out are
``preferences.unsubscribe``'s, the page ``notifications.unsubscribe_views``'. Email with a category
only, never one of ``QUIET_HOURS_BYPASS_CATEGORIES`` (a click on a security alert would opt out of
password resets too), nor a ``required`` type's; campaigns and plain sends otherwise always. The
page and the POST refuse a link of such a category, so one made before the rule cannot either.
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.urls import reverse

from notifications.models import Notification
from notifications.quiet_hours_policy import bypass_categories
from preferences.unsubscribe import UnsubscribeToken, make_token


def carries_unsubscribe(channel: str, category: str, *, campaign: bool, typed: bool, required: bool) -> bool:
    """Whether an email of ``category`` ('' = none) gets the unsubscribe headers (module docstring):
    ``campaign`` a campaign row, ``typed`` an event's row whose type is ``required`` or not."""
    if channel != "email" or not category or category in bypass_categories():
        return False
    if campaign:
        return True
    return not (typed and required)


def unsubscribe_url(n: Notification, *, required: bool) -> str | None:
    """``{PUBLIC_BASE_URL}/u/{token}`` for row ``n`` if its email carries a link, else ``None``.
    ``required``: a typed row's type is required (from its send options: the load stage renders
    them first)."""
    if not carries_unsubscribe(n.channel, n.category, campaign=n.campaign_id is not None,
                               typed=bool(n.notification_type_id), required=required):
        return None
    token = make_token(UnsubscribeToken(user_id=n.recipient_id, category=n.category, channel=n.channel,
                                        campaign_id=n.campaign_id, notification_id=n.pk))
    return settings.PUBLIC_BASE_URL.rstrip("/") + _path_prefix() + token


@functools.cache
def _path_prefix() -> str:
    """``/u/``, from the URL map once (``reverse`` per email cost more than signing the token)."""
    return reverse("unsubscribe", args=["-"]).removesuffix("-")

"""Which notifications an API client may read: the one rule of every API read of notifications
(``GET /v1/notifications/{id}`` and ``GET /v1/users/{id}/notifications``: a row a list shows can be
opened, and no other), never widened by a scope. It reads live and archived rows alike
(:class:`~notifications.models.NotificationRecord`: docs/ARCHITECTURE.md, "Reading across live and history").

A client reads its own single sends. The floors above widen that by registering a rule
(:func:`register_read_rule`): the campaigns app adds the sends of the campaigns the client may read
(``campaigns.ownership.readable_campaign_sends``), so this app imports nothing of campaigns.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Q, QuerySet

from notifications.models import APIClient, Notification, NotificationHistory, NotificationRecord

#: A read rule: ``client -> Q`` over the notification columns (:class:`~notifications.models.NotificationRecord`)
#: of further rows it may read.
ReadRule = Callable[[APIClient], Q]
_rules: list[ReadRule] = []


def register_read_rule(rule: ReadRule) -> None:
    """Let clients also read the notifications ``rule(client)`` selects (once, however often it is
    registered); called from an app's ``AppConfig.ready``."""
    if rule not in _rules:
        _rules.append(rule)


def _allowed(client: APIClient) -> Q:
    allowed = Q(client=client)
    for rule in _rules:
        allowed |= rule(client)
    return allowed


def readable_notifications(client: APIClient) -> QuerySet[NotificationRecord]:
    """The notifications ``client`` may read, live or archived: its own single sends, and what each
    registered rule adds."""
    return NotificationRecord.objects.filter(_allowed(client))


def readable_live_notifications(client: APIClient) -> QuerySet[Notification]:
    """The live rows among :func:`readable_notifications`: what a write on the client's behalf (an app
    receipt) may lock and change; the view of live and history cannot be locked."""
    return Notification.objects.filter(_allowed(client))


def readable_archived_notifications(client: APIClient) -> QuerySet[NotificationHistory]:
    """The archived rows among :func:`readable_notifications`: what a write on the client's behalf
    (an app receipt of a row no longer live) may lock and change in the history."""
    return NotificationHistory.objects.filter(_allowed(client))

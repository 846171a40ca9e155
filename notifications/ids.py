"""Every derived id of the platform, one function each (docs/ARCHITECTURE.md §4): a retried creation
yields the same id and the primary key refuses the copy. Depends on nothing, so models, services
and the campaigns app all import it."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

#: ``uuid5(NOTIFICATION_ID_NAMESPACE, f"{client_id}:{idempotency_key}")``: an API send.
NOTIFICATION_ID_NAMESPACE = uuid.UUID("6f0c1f36-52a1-4b7e-9a43-4f6b8c2d9e10")
#: ``uuid5(EVENT_ID_NAMESPACE, f"{client_id}:{idempotency_key}")``: an event.
EVENT_ID_NAMESPACE = uuid.UUID("3c4f0d5e-6a1b-4e7f-8b2c-9d0e1f2a3b4c")
#: ``uuid5(EVENT_NOTIFICATION_NAMESPACE, f"{event_id}:{user_id}:{channel}")``: an event's notification.
EVENT_NOTIFICATION_NAMESPACE = uuid.UUID("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d")
#: ``uuid5(CAMPAIGN_RUN_NAMESPACE, f"{campaign_id}:{occurrence instant}")``: a recurring campaign's run.
CAMPAIGN_RUN_NAMESPACE = uuid.UUID("7e2a9c14-3b6d-4f58-a1c0-5d8e2f4b6a93")
#: ``uuid5(DIGEST_NOTIFICATION_NAMESPACE, f"{digest_id}:{channel}")``: a digest's notification.
DIGEST_NOTIFICATION_NAMESPACE = uuid.UUID("5d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")


def single_send_id(client_id: str, idempotency_key: str) -> uuid.UUID:
    """The notification of an API send (``POST /v1/notifications``, typed or not)."""
    return uuid.uuid5(NOTIFICATION_ID_NAMESPACE, f"{client_id}:{idempotency_key}")


def event_id(client_id: str, idempotency_key: str) -> uuid.UUID:
    """An event of ``POST /v1/events``."""
    return uuid.uuid5(EVENT_ID_NAMESPACE, f"{client_id}:{idempotency_key}")


def typed_send_event_id(single_send: uuid.UUID) -> uuid.UUID:
    """The event behind a typed single send (it has no key of its own: the notification has)."""
    return uuid.uuid5(EVENT_ID_NAMESPACE, f"notification:{single_send}")


def event_notification_id(event, user_id: str, channel: str) -> uuid.UUID:
    """One notification of an event: its user on one channel."""
    return uuid.uuid5(EVENT_NOTIFICATION_NAMESPACE, f"{event}:{user_id}:{channel}")


def digest_notification_id(digest_id, channel: str) -> uuid.UUID:
    """A digest's notification on one channel (made when the digest closes)."""
    return uuid.uuid5(DIGEST_NOTIFICATION_NAMESPACE, f"{digest_id}:{channel}")


def campaign_run_id(campaign_id, occurrence_at: datetime) -> uuid.UUID:
    """One run of a recurring campaign: its occurrence's instant (aware; written as UTC ISO 8601 to
    the microsecond, so one instant has one name whatever its zone)."""
    instant = occurrence_at.astimezone(UTC).isoformat(timespec="microseconds")
    return uuid.uuid5(CAMPAIGN_RUN_NAMESPACE, f"{campaign_id}:{instant}")


def campaign_notification_id(campaign_id, user_id: str, channel: str) -> uuid.UUID:
    """A campaign's notification: uuid5 over (campaign, user, channel), the campaign id as namespace."""
    return uuid.uuid5(uuid.UUID(str(campaign_id)), f"{user_id}:{channel}")


def campaign_notification_ids(campaign_id, channel: str) -> Callable[[str], str]:
    """:func:`campaign_notification_id` of one campaign and channel as a function of the user id,
    returning the id's canonical text (RFC 4122 §4.3: SHA-1 of namespace + name, version 5, RFC
    variant): the same value without building two ``UUID`` objects per member (fan-out computes a
    million of them)."""
    namespace = uuid.UUID(str(campaign_id)).bytes
    suffix = f":{channel}".encode()
    sha1 = hashlib.sha1

    def for_user(user_id: str) -> str:
        d = sha1(namespace + user_id.encode() + suffix).digest()
        h = (d[:6] + bytes(((d[6] & 0x0F) | 0x50,)) + d[7:8] + bytes(((d[8] & 0x3F) | 0x80,)) + d[9:16]).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    return for_user

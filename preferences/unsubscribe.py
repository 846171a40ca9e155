"""One-click unsubscribe (RFC 8058): the signed token an email's ``List-Unsubscribe`` link carries,
and the opt-out it makes (docs/TYPES.md, "Unsubscribe").

The token is Django's ``signing.dumps`` with :data:`SALT`: no database lookup to verify, naming the
recipient, category, channel and (for attribution) the campaign or notification; :func:`read_token`
refuses one older than :data:`MAX_AGE` or not ours. :func:`unsubscribe` adds the channel to
``category_opt_outs`` and writes an :class:`~preferences.models.Unsubscribe` row under a lock, so a
second click changes nothing; a link issued before the recipient's last erasure is dead
(:func:`check_live`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.core import signing
from django.db import transaction

from core import clock
from preferences.models import Erasure, Recipient, Unsubscribe
from preferences.services import opt_out

SALT = "preferences.unsubscribe"
#: How long a link works (Gmail and Yahoo want it to work for at least 30 days after sending).
MAX_AGE = timedelta(days=60)


class BadToken(ValueError):
    """The token is not one of ours (forged, tampered with, malformed) or older than MAX_AGE."""


@dataclass(frozen=True)
class UnsubscribeToken:
    """What a link says: ``user_id``, ``category``, ``channel`` (``email``), and the email it came in
    (``campaign_id`` for a campaign's, ``notification_id`` for every one; ``None`` when unknown)."""

    user_id: str
    category: str
    channel: str = "email"
    campaign_id: uuid.UUID | None = None
    notification_id: uuid.UUID | None = None
    #: When it was signed, on the platform clock, as the erasures it is compared with (whole seconds;
    #: ``None`` for a link not read from a token).
    issued_at: datetime | None = field(default=None, compare=False)


def make_token(link: UnsubscribeToken) -> str:
    """The URL-safe signed token of ``link`` (``[A-Za-z0-9_-.:]``, about 120–400 characters). ``t``:
    the platform clock's second (:attr:`UnsubscribeToken.issued_at`); the signature's own timestamp,
    which :data:`MAX_AGE` is checked against, is the host's."""
    payload = {"u": link.user_id, "c": link.category, "ch": link.channel, "t": int(clock.now().timestamp())}
    if link.campaign_id is not None:
        payload["k"] = str(link.campaign_id)
    if link.notification_id is not None:
        payload["n"] = str(link.notification_id)
    return signing.dumps(payload, salt=SALT, compress=True)


def read_token(token: str) -> UnsubscribeToken:
    """The link ``token`` stands for.

    Raises:
        BadToken: the signature does not match (forged, any character changed), the token is
            malformed, or it was signed more than :data:`MAX_AGE` ago.
    """
    try:
        payload = signing.loads(token, salt=SALT, max_age=MAX_AGE)
    except signing.SignatureExpired as exc:
        raise BadToken("this link has expired (links work for 60 days)") from exc
    except (signing.BadSignature, ValueError, UnicodeError) as exc:
        raise BadToken("this link is not valid") from exc
    try:
        return UnsubscribeToken(
            user_id=str(payload["u"]), category=str(payload["c"]), channel=str(payload["ch"]),
            campaign_id=uuid.UUID(payload["k"]) if payload.get("k") else None,
            notification_id=uuid.UUID(payload["n"]) if payload.get("n") else None,
            issued_at=datetime.fromtimestamp(int(payload["t"]) if "t" in payload else _signed_at(token), tz=UTC))
    except (KeyError, TypeError, ValueError) as exc:  # signed by us, but not an unsubscribe payload
        raise BadToken("this link is not valid") from exc


def _signed_at(token: str) -> int:
    """The signature's timestamp (the host's clock): a link made before tokens carried ``t`` (the same
    second in production, where the platform clock is the host's)."""
    return signing.b62_decode(token.rsplit(":", 2)[-2])


def check_live(link: UnsubscribeToken) -> Recipient:
    """The link's recipient, if the link still stands for it.

    Raises:
        Recipient.DoesNotExist: no recipient ``link.user_id``, or its personal data was erased at or
            after the second the link was signed (a user re-created since is someone the link never
            named: it must not opt them out).
    """
    recipient = Recipient.objects.get(pk=link.user_id)
    if link.issued_at is not None and Erasure.objects.filter(
            recipient=recipient, erased_at__gte=link.issued_at).exists():
        raise Recipient.DoesNotExist(f"{link.user_id} was erased after this link was issued")
    return recipient


def unsubscribe(link: UnsubscribeToken, source: str) -> bool:
    """Opt the link's recipient out of its category on its channel; ``source`` is an
    :class:`Unsubscribe.Source` value. True when this call made the opt-out (one ``Unsubscribe``
    row written), False when the recipient was already opted out (nothing written).

    Raises:
        Recipient.DoesNotExist: the link is dead (:func:`check_live`).
    """
    with transaction.atomic():
        recipient = check_live(link)
        if not opt_out(recipient, channel=link.channel, category=link.category):
            return False
        Unsubscribe.objects.create(recipient=recipient, category=link.category, channel=link.channel,
                                   source=source, campaign_id=link.campaign_id,
                                   notification_id=link.notification_id, at=clock.now())
    return True

"""The one way in: every road by which a notification comes to exist passes :func:`admit`, which
applies the rules of acceptance in one order: high gate → overrides → content limits → idempotency
→ acceptance (abuse) limits, the free refusals first and the limits last, as they take slots. The
limits' send-time half (:class:`SendLimits`): a row whose contact changed since is counted again.

Each rule keeps its owner; this module only calls them, in that order, with the rules each road
passes (:data:`RULES`). Opt-outs and quiet hours are send-time rules on every road
(``delivery/checks.verdict``). The roads and why each skips what it skips: docs/ARCHITECTURE.md §6,
"Roads in".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rest_framework import serializers

from core.api.refusals import AcceptanceLimited, MissingScope
from core.api.scopes import Scope
from notifications.acceptance import rules as limits
from notifications.acceptance.rules import Reservation, contact_mark, effective_rules, reserve, rules_for, send_rules
from notifications.content_limits import rendered_problem
from notifications.lifecycle import archive
from notifications.models import APIClient, Notification, Priority, Reason

if TYPE_CHECKING:
    from notifications.events.models import NotificationType


class Road(StrEnum):
    """A road by which notifications come to exist (or, for a fallback, become due)."""

    SINGLE = "single"  # POST /v1/notifications
    TYPED = "typed"  # POST /v1/notifications with type
    EVENT = "event"  # POST /v1/events
    CAMPAIGN = "campaign"  # a campaign's fan-out page (inline content, template or type)
    DIGEST = "digest"  # a digest's window closes
    FALLBACK = "fallback"  # the next channel of a fallback type is released
    REPLAY = "replay"  # staff replay a dead letter


class Rule(StrEnum):
    HIGH_GATE = "high_gate"
    OVERRIDES = "overrides"
    CONTENT = "content_limits"
    IDEMPOTENCY = "idempotency"
    LIMITS = "acceptance_limits"


#: The rules each road passes, always in this order (docs/ARCHITECTURE.md §6, "Roads in", says why
#: a road skips one).
RULES: dict[Road, tuple[Rule, ...]] = {
    Road.SINGLE: (Rule.HIGH_GATE, Rule.CONTENT, Rule.IDEMPOTENCY, Rule.LIMITS),
    Road.TYPED: (Rule.HIGH_GATE, Rule.IDEMPOTENCY, Rule.LIMITS),
    Road.EVENT: (Rule.HIGH_GATE, Rule.IDEMPOTENCY, Rule.LIMITS),
    Road.CAMPAIGN: (Rule.HIGH_GATE, Rule.OVERRIDES, Rule.LIMITS),
    Road.DIGEST: (Rule.IDEMPOTENCY,),
    Road.FALLBACK: (),
    Road.REPLAY: (Rule.CONTENT,),
}

#: The road registry: road → the function that creates (or releases) its notifications and calls
#: :func:`admit`. Dotted paths: the campaigns app is a floor above this one. ``tests/test_roads.py``
#: drives each and fails for a road that skips the gate, or a row made outside these.
ROADS: dict[Road, str] = {
    Road.SINGLE: "notifications.services.accept_notification",
    Road.TYPED: "notifications.events.services.accept_event",
    Road.EVENT: "notifications.events.services.accept_event",
    Road.CAMPAIGN: "campaigns.fanout.fan_out_page",
    Road.DIGEST: "notifications.events.digests.close",
    Road.FALLBACK: "notifications.events.fallback.settle",
    Road.REPLAY: "notifications.services.replay_dead_letters",
}


@dataclass(frozen=True)
class Admission:
    """What asks to come in. ``client``: the API client sending (``None``: staff in the admin, or a
    worker's road). ``content``: inline ``{title?, body, html?, data?}``, ``None`` when it is made
    from templates at send time. ``request``: ``(model, pk)`` of the row the request writes first
    (its idempotency key's): when it exists the request replays. ``per_member``: a fan-out page,
    admitted member by member (refusals in :attr:`Decision.refused`) instead of refused whole;
    its ``recipients`` may be user ids, and ``window_id`` names the request in the limit windows."""

    road: Road
    now: datetime
    client: APIClient | None = None
    priority: str = Priority.STANDARD
    category: str = ""
    channels: Sequence[str] = ()
    recipients: Sequence[Any] = ()
    kind: NotificationType | None = None
    content: dict | None = None
    request: tuple[Any, Any] | None = None
    per_member: bool = False
    window_id: str = ""


@dataclass
class Decision:
    """The gate's answer: ``replayed`` (the request's rows exist: answer as before), the limit
    slots taken (use the decision as a context manager around the transaction that writes the rows:
    a failure gives them back), and for a fan-out page the members refused, ``{user_id: (reason,
    detail)}``: their rows are ``suppressed`` with that reason."""

    replayed: bool = False
    reservation: Reservation = field(default_factory=lambda: Reservation([]))
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __enter__(self) -> Decision:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.reservation.__exit__(exc_type, exc, tb)


def high_gate_problem(client: APIClient | None, priority: str, kind: NotificationType | None = None) -> str:
    """Why ``client`` may not send this (``""``: it may): a high-priority type's content or
    ``priority: high`` needs ``notifications:send_high``. ``client`` ``None`` (staff, a worker) is
    not asked here: staff hold the admin's own permission, a worker's road was admitted where it
    began."""
    if client is None or client.has_scope(Scope.SEND_HIGH):
        return ""
    return high_tier_reason(priority, kind)


def high_tier_reason(priority: str, kind: NotificationType | None = None) -> str:
    """Why a send of ``priority`` (or of type ``kind``) is on the high tier, ``""`` if it is not: what
    needs ``notifications:send_high`` (API) or ``campaigns.send_high_priority`` (admin)."""
    if kind is not None and kind.priority == Priority.HIGH:
        return f"type {kind.key} is high priority"
    if priority == Priority.HIGH:
        return "needed for priority=high"
    return ""


def admit(a: Admission) -> Decision:
    """Apply the road's rules (:data:`RULES`) to ``a`` in order. Raises, nothing written:
    MissingScope (403, on ``type`` or ``priority``), ValidationError (422 ``content_limit`` on
    ``content``), AcceptanceLimited (429) or AcceptanceLimitsUnavailable (503). A ``per_member``
    road raises only the 503; its refusals are per member in the decision."""
    decision = Decision()
    for rule in RULES[a.road]:
        if rule is Rule.HIGH_GATE:
            _high_gate(a, decision)
        elif rule is Rule.OVERRIDES:
            _overrides(a, decision)
        elif rule is Rule.CONTENT:
            _content(a)
        elif rule is Rule.IDEMPOTENCY:
            if a.request is not None and _requested_before(*a.request, a.now):
                decision.replayed = True
                return decision
        elif rule is Rule.LIMITS:
            _limits(a, decision)
    return decision


def _requested_before(model, pk, now: datetime) -> bool:
    """Whether the request's row exists: live, or (a notification) in the history."""
    if model is Notification:
        return archive.exists(pk, archive.idempotency_window(now))
    return model.objects.filter(pk=pk).exists()


class ArchivedRequest(Exception):
    """The key's first request was archived: its row is in the history (``row``, an archived copy)."""

    def __init__(self, row: Notification) -> None:
        super().__init__("the request's notification was archived")
        self.row = row


def refuse_archived(pk, now: datetime) -> None:
    """Call right after INSERTing an API send's row ``pk`` when the gate found the request before
    (``Decision.replayed``; a row it found nowhere — one statement over live and history — cannot be
    in the history yet: rows stay live ``HOT_HOURS``), in its transaction: raises
    :class:`ArchivedRequest` when the history holds ``pk`` (any day partition: a key lives as long as its row), so
    the caller rolls back and answers with the original. After the INSERT, not before: an INSERT
    racing the archiver waits for its move to commit, and this later statement then sees the row."""
    rows = archive.archived_by_id([pk], archive.idempotency_window(now))
    if rows:
        raise ArchivedRequest(rows[0])


def original(pk, now: datetime) -> Notification | None:
    """The row an API send's key made: the live one, else its archived copy."""
    live = Notification.objects.filter(pk=pk).first()
    if live is not None:
        return live
    return next(iter(archive.archived_by_id([pk], archive.idempotency_window(now))), None)


def _high_gate(a: Admission, decision: Decision) -> None:
    why = high_gate_problem(a.client, a.priority, a.kind)
    if not why:
        return
    if a.per_member:
        detail = f"the campaign's API key lacks notifications:send_high ({why})"
        decision.refused.update({_user_id(r): (Reason.HIGH_NOT_ALLOWED, detail) for r in a.recipients})
        return
    high_type = a.kind is not None and a.kind.priority == Priority.HIGH
    raise MissingScope(Scope.SEND_HIGH, field="type" if high_type else "priority", why=why)


def bulk_type_problem(kind: NotificationType | None) -> str:
    """Why a campaign may not send type ``kind``, or ``""``: a digest type batches one user's events (a
    campaign is one message per member); a ``required`` or quiet-hours ``bypass`` type overrides
    users' choices, which a bulk send never may (docs/POLICIES.md, "Abuse limits")."""
    if kind is None:
        return ""
    if kind.digest:
        return f"type {kind.key} is a digest type (it batches one user's events); a campaign sends one message each"
    if kind.required or kind.quiet_hours == "bypass":
        return (f"type {kind.key} overrides users' choices (required or quiet_hours bypass); a campaign never "
                "may: send it per user (POST /v1/events)")
    return ""


def _overrides(a: Admission, decision: Decision) -> None:
    why = bulk_type_problem(a.kind)
    if why:
        decision.refused.update({_user_id(r): (Reason.NOT_FOR_CAMPAIGNS, why) for r in a.recipients
                                 if _user_id(r) not in decision.refused})


def _content(a: Admission) -> None:
    if a.content is None:
        return
    c = a.content
    for channel in a.channels:
        problem = rendered_problem(channel, c.get("title") or "", c.get("body") or "", c.get("html") or "",
                                   c.get("data"))
        if problem:
            raise serializers.ValidationError({"content": [serializers.ErrorDetail(problem, code="content_limit")]})


def _limits(a: Admission, decision: Decision) -> None:
    rules = rules_for(type_key=a.kind.key if a.kind is not None else "", category=a.category, channels=a.channels)
    if not rules:
        return
    if not a.per_member:
        request_id = a.window_id or str(a.request[1] if a.request else "")
        decision.reservation = reserve(rules, request_id=request_id, recipients=a.recipients, client=a.client,
                                       now=a.now)
        return
    slots = decision.reservation.slots
    try:
        for recipient in _recipients(a.recipients):
            if recipient.user_id in decision.refused:
                continue
            try:
                slots += reserve(rules, request_id=a.window_id, recipients=[recipient], client=a.client,
                                 now=a.now).slots
            except AcceptanceLimited as exc:
                decision.refused[recipient.user_id] = (Reason.ACCEPTANCE_LIMITED, str(exc.detail))
    except Exception:
        decision.reservation.release()
        raise


def _user_id(recipient) -> str:
    return recipient if isinstance(recipient, str) else recipient.user_id


def _recipients(recipients: Sequence[Any]) -> list:
    """Recipients as rows (their phone and address are what the windows count), in the given order;
    user ids are loaded in one query."""
    ids = [r for r in recipients if isinstance(r, str)]
    if not ids:
        return list(recipients)
    from preferences.models import Recipient

    loaded = {r.user_id: r for r in Recipient.objects.filter(pk__in=ids).only("user_id", "phone", "email")}
    return [loaded[r] if isinstance(r, str) else r for r in recipients if not isinstance(r, str) or r in loaded]


class SendLimits:
    """The abuse limits at send time, for one batch of claimed rows (docs/POLICIES.md, "Abuse
    limits", "At send time"). An SMS or email row whose contact is still the one marked at
    acceptance (``limit_contact``) costs nothing: no query, no Redis call. Otherwise (the contact
    was none, or another, or the row was made without a mark) the phone/address rules in force that
    match it take a slot for the current contact, with the member the request took at acceptance
    (``{request id}:{user_id}``): a window that already holds it counts it once."""

    def __init__(self) -> None:
        self._rules: list[limits.Rule] | None = None  # loaded once per batch, when a row needs them

    def refusal(self, n: Notification, now: datetime) -> str:
        """Why ``n`` may not go (it is over a limit: the detail naming the rule), or ``""``.
        Raises AcceptanceLimitsUnavailable when Redis cannot count it (the row is retried)."""
        if contact_mark(n.recipient, n.channel) == n.limit_contact:
            return ""
        if self._rules is None:
            self._rules = effective_rules()
        rules = send_rules(self._rules, type_key=n.notification_type_id or "", category=n.category,
                           channel=n.channel)
        if not rules:
            return ""
        try:
            reserve(rules, request_id=_window_request(n), recipients=[n.recipient], client=None, now=now)
        except AcceptanceLimited as exc:
            return str(exc.detail)
        return ""


def _window_request(n: Notification) -> str:
    """The request id under which ``n``'s road counted it at acceptance (:func:`admit`): a
    campaign's, an event's, a single send's own; a digest's, its first event's."""
    if n.campaign_id is not None:
        return str(n.campaign_id)
    if n.digest_id is not None:
        from notifications.events.models import DigestItem

        first = DigestItem.objects.filter(digest_id=n.digest_id).order_by("id").values_list("event_id",
                                                                                           flat=True).first()
        return str(first or n.pk)
    if n.event_id is not None and not n.idempotency_key:
        return str(n.event_id)
    return str(n.pk)


def replay_refusals(notification_ids: Sequence[Any], now: datetime) -> dict[Any, str]:
    """The road ``replay`` for dead letters about to be sent again: ``{id: why}`` of those the gate
    refuses. A replay is staff's decision about a message already accepted (its high gate and limits
    were passed then, and counting it again would charge the user for our failure); its stored
    inline content is checked against today's content limits, as a message that breaks them would
    only fail again. Content made from templates is checked when rendered, at send time."""
    from notifications.models import Notification

    refused = {}
    rows = Notification.objects.filter(pk__in=list(notification_ids)).only(
        "pk", "channel", "title", "body", "html", "data", "notification_type", "campaign_id", "digest")
    for n in rows:
        inline = not (n.notification_type_id or n.campaign_id or n.digest_id)
        content = {"title": n.title, "body": n.body, "html": n.html, "data": n.data} if inline else None
        try:
            admit(Admission(road=Road.REPLAY, now=now, channels=[n.channel], content=content))
        except serializers.ValidationError as exc:
            refused[n.pk] = str(exc.detail["content"][0])
    return refused

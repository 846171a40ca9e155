"""What the stages of the send path hand each other (pipeline.py): a claimed row with what the
stages before the call learned about it, each call of it, and the outcomes stage's decision with
what the record stage writes. The ORM row carries only its columns; what a stage learns travels
here. Slotted: one of each per row of a 500-row batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from notifications.delivery.outcomes import AttemptRow, CallError, Decision
from notifications.events.content import SendOptions
from notifications.models import Notification
from preferences.models import Device
from providers.base import SendResult


@dataclass(slots=True)
class Row:
    """A claimed notification ready for its call: ``devices`` the active push devices to send to
    (``[]`` for the other channels), ``silent`` a push sent now as a data-only message (a checks
    verdict), ``options`` a typed row's send options (its content rendered at send time)."""

    n: Notification
    devices: list[Device] = field(default_factory=list)
    silent: bool = False
    options: SendOptions | None = None


@dataclass(slots=True)
class Call:
    """One provider call of a row: its SendResult or error, the push device it went to (``None``
    for the other channels), its latency and when it ended (UTC)."""

    outcome: SendResult | CallError
    device: Device | None
    latency_ms: int
    ended: datetime


@dataclass(slots=True)
class Decided:
    """A row after its calls: the outcomes stage's decision, the attempt rows to write, and the
    ``(error, device)`` pairs of its failed calls (contact hygiene)."""

    row: Row
    decision: Decision
    attempts: list[AttemptRow]
    errors: list[tuple[CallError, Device | None]]

"""Recorded messages and per-provider request counters of the provider emulator."""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import repeat
from operator import floordiv, itemgetter
from typing import IO, Any

#: Fields of one recorded message, in the order of the inspection API and the record file.
#: ``account``: Twilio AccountSid of the request path, FCM project id; ``None`` for SendGrid and SMTP.
#: ``details``: what the provider received beyond the common fields, per provider (``null`` when the
#: handler recorded none)::
#:
#:     twilio    {"from": "+1…" | null, "messaging_service_sid": "MG…" | null}
#:     sendgrid  {"from": {"email", "name"?}, "reply_to": {"email", "name"?} | null}   (this
#:               personalization's effective values: its own ``from``, else the request's)
#:     smtp      {"mail_from": <envelope sender>, "headers": [[name, value], …]}   (as received, in order)
#:     fcm       {"message": <the request's "message" object, exactly as received>}
FIELDS = (
    "provider", "account", "channel", "to", "title", "body", "provider_message_id", "notification_id",
    "received_at_ms", "details",
)
#: Filters accepted by ``/_emulator/messages`` and ``/_emulator/messages/count`` (exact string match;
#: a filter never matches a null field).
FILTERS = ("provider", "account", "channel", "to", "notification_id")
_INDEX = {name: FIELDS.index(name) for name in FIELDS}
CHANNEL_OF = {"twilio": "sms", "sendgrid": "email", "smtp": "email", "fcm": "push"}
#: Providers in the order of the analysis's ``by_provider`` / ``per_bucket``.
PROVIDERS = ("twilio", "sendgrid", "fcm", "smtp")
#: Notification ids listed in the analysis's ``duplicates.examples``.
DUPLICATE_EXAMPLES = 20
_PROVIDER, _ACCOUNT, _CHANNEL = _INDEX["provider"], _INDEX["account"], _INDEX["channel"]
_NOTIFICATION_ID, _RECEIVED_AT = _INDEX["notification_id"], _INDEX["received_at_ms"]
#: Index of the per-message ``extra`` value, kept after the FIELDS in each stored tuple.
_EXTRA = len(FIELDS)
_DETAILS = _INDEX["details"]


class RawJsonDetails:
    """``details`` kept as the raw JSON request body they are part of, decoded only when read
    (:func:`_record`): holding the bytes costs their length and no CPU on the send path (an FCM
    message's dict would cost several times that in memory, at a million messages in a benchmark).

    ``decoded()`` is ``{key: json.loads(raw)[key]}`` (e.g. ``{"message": …}`` of an FCM request).
    """

    __slots__ = ("key", "raw")

    def __init__(self, raw: bytes, key: str) -> None:
        self.raw = raw
        self.key = key

    def decoded(self) -> dict[str, Any]:
        return {self.key: json.loads(self.raw)[self.key]}


def now_ms() -> int:
    """Current UTC time as integer epoch milliseconds."""
    return time.time_ns() // 1_000_000


class MessageStore:
    """Accepted messages in arrival order, optionally appended to a JSON-lines record file.

    In memory at most ``max_messages`` are kept (oldest dropped first; ``0`` = unlimited); the record
    file, opened in append mode and flushed per line, keeps everything across restarts. Each line
    is one JSON object with :data:`FIELDS`. Each message may also carry an ``extra`` value, opaque to
    the store, that a provider API needs to answer reads of its own (Twilio's message list: the From
    number...); it is neither in the inspection API nor in the record file.
    """

    def __init__(self, max_messages: int = 0, record_path: str | None = None) -> None:
        self._items: deque[tuple] = deque(maxlen=max_messages or None)
        self._counts: Counter[tuple[str, str]] = Counter()
        # Open for the store's lifetime (closed in close()); line buffering flushes every message.
        self._record: IO[str] | None = (
            open(record_path, "a", encoding="utf-8", buffering=1) if record_path else None  # noqa: SIM115
        )

    def add(
        self,
        provider: str,
        to: str,
        title: str | None,
        body: str | None,
        provider_message_id: str,
        notification_id: str | None,
        account: str | None = None,
        extra: Any = None,
        details: dict[str, Any] | RawJsonDetails | None = None,
    ) -> int:
        """Record one accepted message; returns its ``received_at_ms`` (now, UTC epoch ms).

        ``account``: Twilio AccountSid, FCM project id, ``None`` for SendGrid and SMTP. ``extra``:
        the provider API's own per-message value (see :meth:`newest`), ``None`` if it needs none.
        ``details``: the provider's ``details`` (:data:`FIELDS`), a dict (never mutated afterwards:
        messages of one request may share it) or :class:`RawJsonDetails`.
        """
        channel = CHANNEL_OF[provider]
        received_at_ms = now_ms()
        item = (provider, account, channel, to, title, body, provider_message_id, notification_id, received_at_ms,
                details, extra)
        if self._items.maxlen is not None and len(self._items) == self._items.maxlen:
            oldest = self._items[0]
            self._counts[("provider", oldest[_PROVIDER])] -= 1
            self._counts[("channel", oldest[_CHANNEL])] -= 1
        self._items.append(item)
        self._counts[("provider", provider)] += 1
        self._counts[("channel", channel)] += 1
        if self._record is not None:
            self._record.write(json.dumps(_record(item), ensure_ascii=False) + "\n")
        return received_at_ms

    def query(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        """Messages matching every ``filters`` item (keys from :data:`FILTERS`), oldest first."""
        return [_record(item) for item in self._matching(filters)]

    def newest(self, filters: dict[str, str]) -> Iterator[tuple[dict[str, Any], Any]]:
        """Messages matching ``filters`` (as :meth:`query`), **newest first**, each as ``(record,
        extra)``: the :data:`FIELDS` dict and the ``extra`` it was added with.

        Lazy, so a reader that stops early scans only the newest messages; a full scan is linear
        in the messages in memory. Do not add messages while iterating.
        """
        checks = [(_INDEX[k], v) for k, v in filters.items()]
        for item in reversed(self._items):
            if all(item[i] == v for i, v in checks):
                yield _record(item), item[_EXTRA]

    def count(self, filters: dict[str, str]) -> int:
        """Number of messages matching ``filters``; O(1) for no filter or one provider/channel filter."""
        if not filters:
            return len(self._items)
        if len(filters) == 1:
            (key, value), = filters.items()
            if key in ("provider", "channel"):
                return self._counts[(key, value)]
        return sum(1 for _ in self._matching(filters))

    def snapshot(self) -> list[tuple]:
        """The in-memory messages now, as tuples in :data:`FIELDS` order, each followed by its
        ``extra`` (for :func:`analyse`)."""
        return list(self._items)

    def clear(self) -> None:
        """Forget the in-memory messages (the record file is left alone)."""
        self._items.clear()
        self._counts.clear()

    def close(self) -> None:
        if self._record is not None:
            self._record.close()
            self._record = None

    def _matching(self, filters: dict[str, str]) -> Iterable[tuple]:
        checks = [(_INDEX[k], v) for k, v in filters.items()]
        return (item for item in self._items if all(item[i] == v for i, v in checks))


def _record(item: tuple) -> dict[str, Any]:
    """The :data:`FIELDS` dict of a stored tuple (its trailing ``extra`` left out, its ``details``
    decoded)."""
    record = dict(zip(FIELDS, item[:_EXTRA], strict=True))
    details = item[_DETAILS]
    if isinstance(details, RawJsonDetails):
        record["details"] = details.decoded()
    return record


def analyse(items: list[tuple], notification_ids: Iterable[str] = (), bucket_ms: int = 1000) -> dict[str, Any]:
    """Benchmark summary of recorded messages (``items`` from :meth:`MessageStore.snapshot`).

    Linear and built for millions of messages (about a second per million): each aggregate is one
    C-level ``Counter``/``map`` pass over the list, plus one Python pass only when
    ``notification_ids`` is not empty; requested ids are looked up in a set, never scanned for. See
    ``POST /_emulator/analysis`` in ``inspection.py`` for the result's shape.
    """
    by_provider = Counter(map(itemgetter(_PROVIDER), items))
    by_account = Counter(map(itemgetter(_ACCOUNT), items))
    per_id = Counter(map(itemgetter(_NOTIFICATION_ID), items))
    per_id.pop(None, None)
    times = list(map(itemgetter(_RECEIVED_AT), items))
    buckets = Counter(zip(map(itemgetter(_PROVIDER), items), map(floordiv, times, repeat(bucket_ms)), strict=True))
    repeated = [(nid, n) for nid, n in per_id.items() if n > 1]  # in order of first arrival
    wanted = set(notification_ids)
    received: dict[str, list[int]] = {}
    if wanted:
        for nid, at in map(itemgetter(_NOTIFICATION_ID, _RECEIVED_AT), items):
            if nid in wanted:
                received.setdefault(nid, []).append(at)
    accounts: dict[str, int] = {}
    for account, n in by_account.items():
        accounts[account or ""] = accounts.get(account or "", 0) + n
    per_bucket: dict[str, list[list[int]]] = {p: [] for p in PROVIDERS}
    for (provider, bucket), n in sorted(buckets.items()):
        per_bucket.setdefault(provider, []).append([bucket * bucket_ms, n])
    return {
        "total": len(items),
        "by_provider": {p: by_provider.get(p, 0) for p in PROVIDERS},
        "by_account": accounts,
        "unique_notification_ids": len(per_id),
        "duplicates": {
            "messages": sum(n for _, n in repeated) - len(repeated),
            "ids": len(repeated),
            "examples": [nid for nid, _ in repeated[:DUPLICATE_EXAMPLES]],
        },
        "received_at_ms": received,
        "per_bucket": per_bucket,
        "first_ms": min(times) if times else None,
        "last_ms": max(times) if times else None,
    }


class Stats:
    """Per-provider request counters: ``requests``, ``accepted``, ``rejected``, ``messages``.

    ``rejected`` counts every non-success answer (auth, validation and injected faults); ``messages``
    counts recorded messages (a SendGrid request with several recipients records several). These
    count sends only; reads are counted apart: ``fcm.token_requests`` (OAuth token requests) and
    ``twilio.list_requests`` (message list requests, answered or not).
    """

    KEYS = ("requests", "accepted", "rejected", "messages")

    def __init__(self) -> None:
        self._counts: dict[str, Counter[str]] = {p: Counter() for p in CHANNEL_OF}
        self.token_requests = 0
        self.twilio_list_requests = 0

    def accepted(self, provider: str, messages: int = 1) -> None:
        c = self._counts[provider]
        c["requests"] += 1
        c["accepted"] += 1
        c["messages"] += messages

    def rejected(self, provider: str) -> None:
        c = self._counts[provider]
        c["requests"] += 1
        c["rejected"] += 1

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {p: {k: c[k] for k in self.KEYS} for p, c in self._counts.items()}
        result["fcm"]["token_requests"] = self.token_requests
        result["twilio"]["list_requests"] = self.twilio_list_requests
        return result

    def reset(self) -> None:
        for c in self._counts.values():
            c.clear()
        self.token_requests = 0
        self.twilio_list_requests = 0

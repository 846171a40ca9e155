"""Bench recipients and segments, written with psycopg ``COPY`` (≈ 50k rows/s; ``bulk_create`` ≈ 12k).

Every recipient has an email, an E.164 phone and one active Android device, so one segment serves
every channel. A segment ``bench-seg-<N>`` of the right size is reused across runs (at 1M, seeding
takes minutes); its recipients are ``b<N>-<i>``; OTP recipients (``bench-otp-<i>``) are in no
segment. ``bench_fanout`` seeds its own ``bench-<N>`` segments without devices; the ids differ so
the two never disagree about a segment's members.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

from django.db import connection, models, transaction

from campaigns.models import Segment, SegmentMember
from preferences.models import Device, Recipient

log = logging.getLogger(__name__)
CHUNK = 50_000


def segment_id_for(members: int) -> str:
    return f"bench-seg-{members}"


def member_ids(members: int) -> list[str]:
    """The user ids of segment ``bench-seg-<members>``'s recipients, in seeding order."""
    return [f"b{members}-{i:07d}" for i in range(members)]


def recipient_row(user_id: str, index: int) -> dict:
    """One bench recipient's contacts (phone numbers are unique per index below 10^8)."""
    return {"user_id": user_id, "email": f"{user_id}@example.com", "phone": f"+49151{index % 10**8:08d}",
            "timezone": "Europe/Berlin", "locale": "en", "attributes": {"first_name": f"U{index}"}}


def ensure_segment(members: int, progress: Callable[[str], None] = log.info) -> tuple[Segment, float]:
    """The segment ``bench-seg-<members>``, seeded if it is missing or has another size.

    Returns ``(segment, seconds spent seeding)`` (0 when reused).
    """
    segment_id = segment_id_for(members)
    segment, _ = Segment.objects.get_or_create(segment_id=segment_id, defaults={"name": segment_id})
    have = SegmentMember.objects.filter(segment=segment).count()
    if have == members:
        return segment, 0.0
    progress(f"seeding segment {segment_id}: {members:,} recipients with email, phone and a push device…")
    t0 = time.perf_counter()
    user_ids = member_ids(members)
    with transaction.atomic():
        SegmentMember.objects.filter(segment=segment).delete()
        ensure_recipients(user_ids, first_index=0)
        added_at = datetime.now(UTC) - timedelta(minutes=1)
        copy_rows(SegmentMember, ({"segment_id": segment_id, "recipient_id": u, "added_at": added_at}
                                  for u in user_ids), conflict_free=True)
    with connection.cursor() as cur:
        cur.execute("ANALYZE preferences_recipient; ANALYZE preferences_device; ANALYZE campaigns_segmentmember")
    seconds = time.perf_counter() - t0
    progress(f"seeded {members:,} recipients in {seconds:.0f} s")
    return segment, seconds


def ensure_otp_recipients(count: int) -> list[str]:
    """``bench-otp-00000…``: recipients of the OTP stream (created once)."""
    user_ids = [f"bench-otp-{i:05d}" for i in range(count)]
    if Recipient.objects.filter(user_id__in=user_ids).count() != count:
        with transaction.atomic():
            ensure_recipients(user_ids, first_index=10**7)
    return user_ids


def ensure_recipients(user_ids: list[str], first_index: int) -> None:
    """Insert the recipients and their push devices that do not exist yet (``ON CONFLICT DO NOTHING``)."""
    now = datetime.now(UTC)
    for start in range(0, len(user_ids), CHUNK):
        chunk = user_ids[start:start + CHUNK]
        copy_rows(Recipient, ({**recipient_row(u, first_index + start + i), "created_at": now, "updated_at": now}
                              for i, u in enumerate(chunk)))
        copy_rows(Device, ({"recipient_id": u, "platform": "android", "push_token": f"bench-token-{u}",
                            "active": True, "registered_at": now, "updated_at": now} for u in chunk))


def copy_rows(model: type[models.Model], rows: Iterable[dict], conflict_free: bool = False) -> None:
    """COPY ``rows`` (column name → value; missing columns get the field's default) into the model's
    table; through a temporary table and ``INSERT … ON CONFLICT DO NOTHING`` unless ``conflict_free``."""
    fields = [f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField)]
    columns = [f.column for f in fields]
    table = model._meta.db_table
    column_list = ", ".join(f'"{c}"' for c in columns)
    with connection.cursor() as wrapper:
        cur = wrapper.cursor  # the psycopg cursor
        target = table
        if not conflict_free:
            target = f"bench_copy_{table}"
            cur.execute(f'DROP TABLE IF EXISTS "{target}"')
            cur.execute(f'CREATE TEMP TABLE "{target}" ON COMMIT DROP AS SELECT {column_list} FROM "{table}" '
                        "WITH NO DATA")
        with cur.copy(f'COPY "{target}" ({column_list}) FROM STDIN') as copy:
            for row in _values(fields, rows):
                copy.write_row(row)
        if not conflict_free:
            cur.execute(f'INSERT INTO "{table}" ({column_list}) SELECT {column_list} FROM "{target}" '
                        "ON CONFLICT DO NOTHING")


def _values(fields: list[models.Field], rows: Iterable[dict]) -> Iterator[tuple]:
    names = [(f.attname, f.name) for f in fields]
    defaults = [None if f.null and not f.has_default() else f.get_default() for f in fields]
    is_json = [isinstance(f, models.JSONField) for f in fields]
    for row in rows:
        out = []
        for (attname, name), default, as_json in zip(names, defaults, is_json, strict=True):
            value = row.get(attname, row.get(name, default))
            if as_json and value is not None:
                value = json.dumps(value)
            out.append(value)
        yield tuple(out)

"""``manage.py bench --receipts``: the providers' delivery receipts during a blast, as production gets them.

The emulator sends them (``providers/emulator/receipts.py``, ``webhooks.py``) with the delay and mix
of :data:`RULES`: SendGrid ``processed`` and ``delivered`` per email, in signed Event Webhook batches;
Twilio ``sent`` and ``delivered`` per SMS, a ``queued`` first for some, signed as Twilio's
RequestValidator checks; FCM none. After the campaign drained the bench waits until every receipt
is applied (:func:`settle`) and :func:`summarize` says what was sent, what was stored, what each
notification ended as, and what the receipts cost on top of the same run without them
(docs/PERFORMANCE.md, "Delivery receipts").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from django.db import connection

from bench.emulator import Emulator
from bench.stats import cpu_us_per_message

#: Receipt rules posted to the emulator (first match wins). Delays are those of the real providers
#: within a few seconds; a message's next receipt follows once the previous one was answered.
RULES = (
    {"provider": "twilio", "delay_ms": 2000, "queued_share": 0.5},
    {"provider": "sendgrid", "delay_ms": 3000},
)
#: What the bench stack's environment gets on top of its own (production_stack drops it otherwise).
ENV = {"EMULATOR_RECEIPTS": "1"}
#: The processes that handle receipts: the webhook views, the queue, the worker applying them, the database.
RECEIPT_KINDS = ("web", "redis", "worker_receipts", "postgres")
CHANNEL_OF_PROVIDER = {"sendgrid": "email", "twilio": "sms"}
#: Rows sent by a provider that sends receipts (``twilio_backup`` too); the SMTP fallback sends none,
#: as in production, so its rows stay ``sent``.
WITH_RECEIPTS = "provider ~ '^(sendgrid|twilio)'"
#: Give up when nothing changed for this long after the last webhook was answered.
STALL_SECONDS = 30.0


def install(emulator: Emulator) -> list[dict]:
    """Post :data:`RULES` to the emulator; returns them as it stored them."""
    out = []
    for rule in RULES:
        r = emulator.http.post(f"{emulator.base}/_emulator/receipts", json=rule, timeout=10)
        r.raise_for_status()
        out.append(r.json())
    return out


def webhook_stats(emulator: Emulator) -> dict:
    r = emulator.http.get(f"{emulator.base}/_emulator/webhooks/stats", timeout=60)  # a busy emulator
    r.raise_for_status()
    return r.json()


def _scope(campaign_ids: Sequence[str] | None, alias: str = "") -> tuple[str, list]:
    """SQL condition and parameters: rows of these campaigns, or (``None``) every row: the bench
    empties the table before a run, so every row is the run's (campaign, warm-up and OTPs)."""
    if campaign_ids is None:
        return "TRUE", []
    return f"{alias}campaign_id = ANY(%s::uuid[])", [list(campaign_ids)]


def _unsettled(campaign_ids: Sequence[str] | None = None) -> int:
    """Email and SMS rows still ``sent``: a ``delivered`` receipt of theirs is not applied yet."""
    where, params = _scope(campaign_ids)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM notifications_notification WHERE channel IN ('email', 'sms') "
                    f"AND status = 'sent' AND {WITH_RECEIPTS} AND {where}", params)
        return cur.fetchone()[0]


def _queued() -> int:
    from notifications.health import queue_snapshot

    return queue_snapshot().get("receipts", {}).get("depth", 0)


def settle(emulator: Emulator, timeout: float, progress: Callable[[str], None], label: str,
           campaign_ids: Sequence[str] | None = None) -> dict:
    """Wait until the emulator has no receipt left to send, the receipts queue is empty and no email
    or SMS row is still ``sent``; the database is asked only once the first two hold (its CPU counts
    in the run). Returns ``{"seconds", "unsettled", "timed_out"}``."""
    start = time.monotonic()
    last_change, last_unsettled = start, None
    while True:
        pending = webhook_stats(emulator)["pending"]
        unsettled = _unsettled(campaign_ids) if not pending and not _queued() else None
        if unsettled == 0:
            return {"seconds": round(time.monotonic() - start, 1), "unsettled": 0, "timed_out": False}
        if unsettled != last_unsettled or pending:
            last_change, last_unsettled = time.monotonic(), unsettled
        now = time.monotonic()
        if now - start > timeout or (unsettled is not None and now - last_change > STALL_SECONDS):
            progress(f"[{label}] receipts did not settle: {unsettled} row(s) still sent, {pending} pending")
            left = unsettled if unsettled is not None else _unsettled(campaign_ids)
            return {"seconds": round(now - start, 1), "unsettled": left, "timed_out": True}
        time.sleep(1.0)


def stored_by_kind(campaign_ids: Sequence[str] | None = None) -> dict[str, int]:
    """Receipts the platform stored, as ``"<provider>:<kind>"`` (the emulator's keys)."""
    provider_of = {channel: provider for provider, channel in CHANNEL_OF_PROVIDER.items()}
    where, params = _scope(campaign_ids, "n.")
    with connection.cursor() as cur:
        cur.execute("SELECT n.channel, e.kind, count(*) FROM notifications_deliveryevent e "
                    "JOIN notifications_notification n ON n.id = e.notification_id "
                    f"WHERE e.kind LIKE 'receipt:%%' AND {where} GROUP BY 1, 2", params)
        return {f"{provider_of.get(channel, channel)}:{kind.removeprefix('receipt:')}": count
                for channel, kind, count in cur.fetchall()}


def applied_twice(campaign_ids: Sequence[str] | None = None) -> int:
    """Notifications holding one receipt kind more than once (each receipt must be stored once)."""
    where, params = _scope(campaign_ids, "n.")
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM (SELECT 1 FROM notifications_deliveryevent e "
                    "JOIN notifications_notification n ON n.id = e.notification_id "
                    f"WHERE e.kind LIKE 'receipt:%%' AND {where} GROUP BY e.notification_id, e.kind "
                    "HAVING count(*) > 1) t", params)
        return cur.fetchone()[0]


def statuses_by_channel(campaign_ids: Sequence[str] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """The run's email and SMS rows by channel, provider (the SMTP fallback's get no receipts) and status."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    where, params = _scope(campaign_ids)
    with connection.cursor() as cur:
        cur.execute("SELECT channel, provider, status, count(*) FROM notifications_notification "
                    f"WHERE channel IN ('email', 'sms') AND {where} GROUP BY 1, 2, 3", params)
        for channel, provider, status, count in cur.fetchall():
            out.setdefault(channel, {}).setdefault(provider or "none", {})[status] = count
    return out


def cost(with_receipts: dict, without: dict | None, kinds: list[str]) -> dict:
    """CPU-µs per notification of ``kinds`` (the platform) and of :data:`RECEIPT_KINDS`, in the run
    with receipts and in the one without, and the share the receipts add (``None`` without a baseline)."""
    def per_kind(run: dict | None) -> dict[str, float | None]:
        if not run:
            return {}
        cpu = run["cpu"]
        return {k: cpu_us_per_message(cpu["seconds_by_kind"], [k], cpu["notifications_counted"]) for k in kinds}

    with_k, without_k = per_kind(with_receipts), per_kind(without)

    def total(values: dict, names) -> float | None:
        known = [values.get(k) for k in names if values.get(k) is not None]
        return round(sum(known), 1) if known else None

    platform_with, platform_without = total(with_k, kinds), total(without_k, kinds)
    handlers_with, handlers_without = total(with_k, RECEIPT_KINDS), total(without_k, RECEIPT_KINDS)
    share = (round((platform_with - platform_without) / platform_without, 3)
             if platform_with is not None and platform_without else None)
    return {
        "us_per_notification_by_kind": with_k,
        "us_per_notification_by_kind_without_receipts": without_k,
        "platform_us_per_notification": platform_with,
        "platform_us_per_notification_without_receipts": platform_without,
        "handlers_us_per_notification": handlers_with,
        "handlers_us_per_notification_without_receipts": handlers_without,
        "share_on_top": share,
        "target_share": 0.30,
    }


def collect(emulator: Emulator, settled: dict, campaign_ids: Sequence[str] | None = None) -> dict:
    """What was sent, stored and ended, after :func:`settle` (the emulator's counts: since its start
    or its last ``DELETE /_emulator/webhooks``)."""
    stats = webhook_stats(emulator)
    return {
        "rules": list(RULES),
        "settle": settled,
        "sent_by_kind": dict(sorted(stats.get("events_delivered", {}).items())),
        "dropped_by_kind": dict(sorted(stats.get("events_dropped", {}).items())),
        "webhook_requests": {k: stats.get(k) for k in ("attempts", "succeeded", "failed_attempts", "dropped")},
        "accepted_by_kind": dict(sorted(stored_by_kind(campaign_ids).items())),
        "applied_twice": applied_twice(campaign_ids),
        "statuses": statuses_by_channel(campaign_ids),
    }


def problems(block: dict | None) -> list[str]:
    """What makes a ``--receipts`` run exit 1: a receipt dropped, not stored or stored twice, a row
    not ``delivered`` at the end."""
    if block is None:
        return []
    out = []
    if block["dropped_by_kind"]:
        out.append(f"receipts dropped by the emulator (never answered 2xx): {block['dropped_by_kind']}")
    if block["sent_by_kind"] != block["accepted_by_kind"]:
        out.append(f"receipts sent {block['sent_by_kind']} != stored {block['accepted_by_kind']}")
    if block["applied_twice"]:
        out.append(f"{block['applied_twice']} notification(s) hold a receipt kind twice")
    for channel, providers in block["statuses"].items():
        for provider, statuses in providers.items():
            if provider.startswith(tuple(CHANNEL_OF_PROVIDER)) and set(statuses) - {"delivered"}:
                out.append(f"{channel} rows of {provider} not delivered at the end: {statuses}")
    return out


def summary_text(block: dict) -> str:
    """The receipts' lines of the printed summary."""
    c = block.get("cost") or {}
    lines = ["delivery receipts (kind: sent by the emulator / stored by the platform):"]
    for kind in sorted(set(block["sent_by_kind"]) | set(block["accepted_by_kind"])):
        lines.append(f"  {kind}: {block['sent_by_kind'].get(kind, 0):,} / {block['accepted_by_kind'].get(kind, 0):,}")
    lines.append(f"  applied twice: {block['applied_twice']}; settled {block['settle']['seconds']} s after the drain")
    lines.append(f"  rows by status at the end: {block['statuses']}")
    lines.append(f"  platform CPU-µs / notification: {c.get('platform_us_per_notification')} with receipts, "
                 f"{c.get('platform_us_per_notification_without_receipts')} without; share on top "
                 f"{c.get('share_on_top')} (target ≤ {c.get('target_share')})")
    lines.append(f"  web + redis + receipts worker + Postgres CPU-µs / notification: "
                 f"{c.get('handlers_us_per_notification')} with, "
                 f"{c.get('handlers_us_per_notification_without_receipts')} without")
    return "\n".join(lines)

"""A receipts worker killed (SIGKILL) in the middle of a batch loses none of the receipts the webhook
answered 2xx for: the batch waits in its leased processing list and, once the lease ran out, the
reconciler's tick has it applied, each receipt once (notifications/receipts_buffer.py)."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection

from bench.stack import wait_until
from core.redis_client import get_redis
from notifications import receipts_buffer
from notifications.models import Notification
from tests.e2e import SENT, make_user, send, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

#: notifications.receipts._DEDUP_LOCK_CLASS: the advisory locks the drain takes per receipt key.
DEDUP_LOCK_CLASS = 7301


def test_a_receipts_worker_killed_mid_batch_loses_no_receipt(api, emulator, uid, stack):
    user = make_user(api, uid)
    emulator.add_receipt_rule(provider="twilio", to=user["phone"], outcome="delivered", delay_ms=3000)
    nid = send(api, uid, "sms")
    sid = wait_status(nid, SENT, timeout=15).provider_message_id
    keys = [f"twilio:{sid}:{status}:" for status in ("queued", "sent", "delivered")]
    with connection.cursor() as cur:  # the drain will wait for these inside its batch's transaction
        for key in keys:
            cur.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [DEDUP_LOCK_CLASS, key])
    try:
        redis = get_redis()
        assert wait_until(lambda: redis.zcard(receipts_buffer.PROCESSING) == 1, timeout=20)  # taken, not applied
        stack.kill("worker_receipts")
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock_all()")
    assert Notification.objects.get(pk=nid).status == "sent"  # its receipts were taken, not applied
    stack.start("worker_receipts")

    n = wait_status(nid, "delivered", timeout=75)  # after the 30 s lease, the reconciler's tick
    kinds = Counter(k for k in n.events.values_list("kind", flat=True) if k.startswith("receipt:"))
    assert {"receipt:sent", "receipt:delivered"} <= set(kinds)
    assert set(kinds.values()) == {1}
    assert wait_until(lambda: redis.zcard(receipts_buffer.PROCESSING) == 0, timeout=10)

"""End to end: ``bench --receipts``'s delivery receipts (bench/receipts.py) on a small campaign per
channel through the real stack: the emulator sends SendGrid's signed event batches and Twilio's
signed callbacks as the bench has it send them, and every receipt is applied exactly once."""

from __future__ import annotations

import uuid

import pytest

from bench import receipts as bench_receipts
from bench.emulator import Emulator
from tests.e2e import make_segment
from tests.test_e2e_campaigns import create_campaign, wait_campaign

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

N = 200


def test_a_campaign_per_channel_ends_delivered_with_each_receipt_applied_once(api, emulator):
    emu = Emulator(emulator.emulator)
    emu.http.delete(f"{emu.base}/_emulator/webhooks", timeout=10).raise_for_status()  # zero the counters
    bench_receipts.install(emu)  # removed again by the emulator fixture
    campaigns = []
    for channel in ("email", "sms"):
        segment_id, _users, _ = make_segment(api, N, channel=channel)
        content = {"body": "Hello {{ first_name }}"} if channel == "sms" else {"title": "T", "body": "Hi"}
        campaigns.append(create_campaign(api, {"segment_id": segment_id, "channel": channel,
                                               "name": f"receipts {channel} {uuid.uuid4().hex[:6]}",
                                               "content": content}))
    for cid in campaigns:
        wait_campaign(api, cid, "completed", timeout=180)

    settled = bench_receipts.settle(emu, 180, print, "e2e", campaign_ids=campaigns)
    block = bench_receipts.collect(emu, settled, campaigns)

    assert settled["unsettled"] == 0 and not settled["timed_out"]
    assert block["statuses"] == {"email": {"sendgrid": {"delivered": N}}, "sms": {"twilio": {"delivered": N}}}
    # SendGrid: processed + delivered per email; Twilio: sent + delivered per SMS, queued first for half.
    assert block["sent_by_kind"] == {"sendgrid:delivered": N, "sendgrid:processed": N, "twilio:delivered": N,
                                     "twilio:queued": N // 2, "twilio:sent": N}
    assert block["dropped_by_kind"] == {}
    assert block["accepted_by_kind"] == block["sent_by_kind"]  # each stored once, none lost
    assert block["applied_twice"] == 0
    assert bench_receipts.problems(block) == []

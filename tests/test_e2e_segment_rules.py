"""End to end: a campaign on a rule segment through real workers, beat, Postgres, Redis and the
emulator sends to exactly the recipients its rule matches at the snapshot, once each
(docs/SEGMENTS.md)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from preferences.models import Preferences, Recipient
from tests.test_e2e_campaigns import create_campaign, sent, wait_campaign

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_campaign_on_a_rule_segment_reaches_exactly_the_matching_recipients(api, emulator):
    batch = f"r{uuid.uuid4().hex[:8]}"  # the shared database holds other tests' recipients: this run's mark
    users = [f"{batch}-{i:03d}" for i in range(40)]
    Recipient.objects.bulk_create([
        Recipient(user_id=u, email=f"{u}@example.com", locale="de-AT" if i % 2 else "en",
                  attributes={"batch": batch, "first_name": f"User{i}"}, timezone="Europe/Berlin")
        for i, u in enumerate(users)])
    opted = users[1::4]  # odd, so German: opted out of marketing email
    Preferences.objects.bulk_create([Preferences(recipient_id=u, category_opt_outs={"marketing": ["email"]})
                                     for u in opted])
    rules = {"and": [{"attribute": "batch", "op": "eq", "value": batch}, {"locale": ["de"]}, {"subscribed": True}]}
    expected = {f"{u}@example.com" for i, u in enumerate(users) if i % 2 and u not in opted}
    assert len(expected) == 10
    r = api.request("POST", "/v1/segment-preview", json={"rules": rules, "channel": "email"})
    assert r.json() == {"count": 10, "exact": True}
    segment_id = f"seg-{batch}"
    assert api.request("PUT", f"/v1/segments/{segment_id}", json={"name": batch, "rules": rules}).status_code == 201
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "email",
                                "content": {"title": "Hallo {{ first_name }}", "body": "Angebot"}})
    body = wait_campaign(api, cid, "completed", timeout=120)
    assert body["member_count"] == 10 and sent(body["counts"]) == 10 and body["counts"]["total"] == 10
    got = Counter(m["to"] for m in emulator.messages(channel="email") if m["to"].startswith(batch))
    assert set(got) == expected and set(got.values()) == {1}

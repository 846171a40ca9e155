"""The receiver and the counting of ``manage.py bench --webhooks`` (bench/webhook_receiver.py): signed
deliveries counted per webhook-id and type, a missing one lost, a bad signature rejected, an outage
refusing connections."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests
from standardwebhooks import Webhook

from bench.webhook_receiver import Receiver, tally
from notifications.webhooks.endpoints import new_secret


@pytest.fixture
def receiver():
    r = Receiver(new_secret())
    yield r
    r.close()


def post(receiver: Receiver, session: requests.Session, msg_id: str, event_type: str, secret: str | None = None):
    at = datetime.now(UTC)
    stamp = at.isoformat().replace("+00:00", "Z")
    body = json.dumps({"type": event_type, "timestamp": stamp, "data": {"at": stamp}}).encode()
    signer = Webhook(secret) if secret else receiver.verifier
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(at.timestamp())),
               "webhook-signature": signer.sign(msg_id, at, body), "Content-Type": "application/json"}
    return session.post(f"http://127.0.0.1:{receiver.port}/hooks", data=body, headers=headers, timeout=5)


def ids(n: int) -> list[str]:
    return [f"msg_{uuid.uuid4().hex}" for _ in range(n)]


def test_every_delivery_counted_once_and_duplicates_apart(receiver):
    sent = ids(3)
    expected = {sent[0]: "notification.sent", sent[1]: "notification.sent", sent[2]: "campaign.completed"}
    with requests.Session() as s:
        assert [post(receiver, s, i, t).status_code for i, t in expected.items()] == [204, 204, 204]
        assert post(receiver, s, sent[1], "notification.sent").status_code == 204  # a retry: same webhook-id
    counts = tally(expected, receiver.state())
    assert {k: counts[k] for k in ("expected", "received", "duplicates", "lost", "unexpected", "rejected")} == {
        "expected": 3, "received": 3, "duplicates": 1, "lost": 0, "unexpected": 0, "rejected": 0}
    assert counts["by_type"] == {
        "campaign.completed": {"expected": 1, "received": 1, "duplicates": 0, "lost": 0},
        "notification.sent": {"expected": 2, "received": 2, "duplicates": 1, "lost": 0}}
    first = receiver.state()["received"][sent[0]]
    assert first[0] == "notification.sent" and first[3] == 1 and 0 <= first[2] - first[1] < 5000


def test_a_missing_webhook_is_lost(receiver):
    sent = ids(3)
    expected = dict.fromkeys(sent, "notification.sent")
    with requests.Session() as s:
        for i in sent[:2]:
            assert post(receiver, s, i, "notification.sent").status_code == 204
    counts = tally(expected, receiver.state())
    assert (counts["received"], counts["lost"], counts["lost_ids"]) == (2, 1, [sent[2]])
    assert counts["by_type"]["notification.sent"]["lost"] == 1


def test_a_bad_signature_is_refused_and_not_counted(receiver):
    msg = ids(1)[0]
    with requests.Session() as s:
        assert post(receiver, s, msg, "notification.sent", secret=new_secret()).status_code == 400
    counts = tally({msg: "notification.sent"}, receiver.state())
    assert (counts["received"], counts["lost"], counts["rejected"]) == (0, 1, 1)


def test_down_refuses_connections_then_listens_again(receiver):
    before, during, after = ids(3)
    with requests.Session() as s:  # keep-alive: the open connection is cut too
        assert post(receiver, s, before, "notification.sent").status_code == 204
        receiver.down(1.0)
        with pytest.raises(requests.ConnectionError):
            post(receiver, s, during, "notification.sent")
        time.sleep(1.5)
        assert post(receiver, s, after, "notification.sent").status_code == 204
    state = receiver.state()
    assert sorted(state["received"]) == sorted([before, after])
    [outage] = state["outages"]
    assert 900 <= outage["up_ms"] - outage["down_ms"] < 1500


def test_the_bench_stack_runs_the_webhook_worker_as_the_procfile_only_with_webhooks(tmp_path):
    from bench.production_stack import BenchStack
    from bench.stack import procfile_command

    plain = BenchStack("postgres://x/y", "redis://x/3", tmp_path / "a", log_dir=tmp_path)
    with_hooks = BenchStack("postgres://x/y", "redis://x/3", tmp_path / "b", log_dir=tmp_path, webhooks=True)
    assert "worker_webhooks" not in plain.commands()
    assert set(with_hooks.commands()) - set(plain.commands()) == {"worker_webhooks"}
    procfile = " ".join(procfile_command("worker_webhooks", 0)).split(" worker ", 1)[1]
    assert " ".join(with_hooks.commands()["worker_webhooks"]).split(" worker ", 1)[1] == procfile.replace(
        "-l info", "-l warning")
    env = with_hooks.env()
    assert env["WEBHOOKS_ALLOW_INSECURE"] == "1" and "WEBHOOKS_CACHE_SECONDS" not in env  # production's 5 s


def test_the_summary_counts_ids_and_arrivals(receiver):
    first, second = ids(2)
    with requests.Session() as s:
        for msg in (first, second, second):
            assert post(receiver, s, msg, "notification.sent").status_code == 204
        assert post(receiver, s, ids(1)[0], "notification.sent", secret=new_secret()).status_code == 400
    assert receiver.summary() == {"ids": 2, "arrivals": 3, "rejected": 1}

"""End to end: a push sent through the real stack (API, workers, beat, Postgres, Redis, the emulator
driven by firebase-admin), then the app's receipts posted over HTTP to gunicorn and the timeline read
back (notifications/app_receipts.py)."""

from __future__ import annotations

from datetime import datetime

import pytest

from bench.stack import wait_until
from notifications.models import DeliveryEvent
from tests.e2e import SENT, make_user, send, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_the_apps_receipts_move_a_sent_push_up_to_opened_once_each_in_the_timeline(api, emulator, uid):
    user = make_user(api, uid)
    nid = send(api, uid, "push")
    wait_status(nid, SENT)
    got = wait_until(lambda: emulator.messages(notification_id=nid), 5, message="emulator record")
    assert [(m["channel"], m["to"]) for m in got] == [("push", user["tokens"][0])]

    def receipt(event: str) -> tuple[int, dict]:
        r = api.request("POST", f"/v1/notifications/{nid}/receipts", json={"event": event})
        return r.status_code, {k: r.json()[k] for k in ("duplicate", "status", "status_changed")}

    assert receipt("displayed") == (201, {"duplicate": False, "status": "displayed", "status_changed": True})
    assert receipt("opened") == (201, {"duplicate": False, "status": "opened", "status_changed": True})
    assert receipt("opened") == (200, {"duplicate": True, "status": "opened", "status_changed": False})
    assert receipt("displayed") == (200, {"duplicate": True, "status": "opened", "status_changed": False})
    assert receipt("dismissed") == (201, {"duplicate": False, "status": "opened", "status_changed": False})

    detail = api.request("GET", f"/v1/notifications/{nid}").json()
    assert detail["status"] == "opened"
    assert [(e["kind"], e["status"]) for e in detail["timeline"]] == [
        ("accepted", "queued"), ("sent", "sent"), ("app_displayed", "displayed"), ("app_opened", "opened"),
        ("app_dismissed", "")]
    instants = [datetime.fromisoformat(e["at"]) for e in detail["timeline"]]
    assert instants == sorted(instants)
    assert DeliveryEvent.objects.filter(notification_id=nid, kind__startswith="app_").count() == 3
    assert len(emulator.messages(notification_id=nid)) == 1  # a receipt never sends anything

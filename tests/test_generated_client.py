"""A client generated from the schema works (issue 23 #4): openapi-python-client generates a Python
client from the running stack's ``/api/schema/`` into a temporary directory, and the README's quick
start is driven through it against the real stack (bench/stack.py: gunicorn, workers, emulator),
with an API key holding the quick start's scopes (plus ``types:write`` for the typed send).

A generated client sends every field the schema gives a default; the schema declared defaults for a
send's ``priority`` and ``sensitive``, so every typed send through such a client was
``422 not_allowed_with_type`` (docs/SECURITY.md, "The schema declares no default…"). The answers are
parsed by the generated models, so a response that breaks its schema fails here too.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid

import pytest
import requests

from bench.stack import wait_until
from tests.conftest import make_client
from tests.e2e import SENT, phone

pytestmark = pytest.mark.e2e

QUICK_START_SCOPES = ["notifications:send", "recipients:write", "devices:write", "read", "types:write"]


@pytest.fixture
def generated(emulator, tmp_path):
    """The package generated from the stack's served schema, imported as ``notify_client``."""
    schema = tmp_path / "schema.json"
    schema.write_bytes(requests.get(f"{emulator.api}/api/schema/?format=json", timeout=30).content)
    config = tmp_path / "config.yaml"
    config.write_text("post_hooks: []\n")  # no formatter run (ruff is not needed to import the code)
    tool = f"{sys.prefix}/bin/openapi-python-client"
    done = subprocess.run([tool, "generate", "--path", str(schema), "--meta", "none", "--config", str(config),
                           "--output-path", str(tmp_path / "notify_client")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr  # no operation left out
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("notify_client")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "notify_client" or n.startswith("notify_client.")]:
            del sys.modules[name]


def test_the_readme_quick_start_through_a_generated_client(generated, emulator, live_db):
    from notify_client import AuthenticatedClient
    from notify_client.api.v1 import (
        v1_notification_types_update,
        v1_notifications_create,
        v1_notifications_retrieve,
        v1_users_devices_update,
        v1_users_update,
    )
    from notify_client.models import (
        ChannelEnum,
        ContentRequest,
        DeviceRequest,
        Error,
        NotificationTypeRequest,
        PlatformEnum,
        PriorityEnum,
        RecipientRequest,
        SendRequestRequest,
        TypeTemplateRequest,
    )
    from notify_client.models.send_request_request_data import SendRequestRequestData

    _, key = make_client("generated-client", allow_high=True, scopes=QUICK_START_SCOPES)
    client = AuthenticatedClient(base_url=emulator.api, token=key, prefix="Api-Key", timeout=30)
    uid, kind, token = f"gen-{uuid.uuid4().hex[:10]}", f"shipped_{uuid.uuid4().hex[:6]}", f"tok-{uuid.uuid4().hex}"
    number, email = phone(), f"{uid}@example.com"

    # 2. A recipient and a device.
    r = v1_users_update.sync_detailed(uid, client=client, body=RecipientRequest(
        email=email, phone=number, timezone="Europe/Berlin", locale="de-DE"))
    assert (r.status_code, r.parsed.user_id, r.parsed.phone) == (201, uid, number)
    r = v1_users_devices_update.sync_detailed(uid, client=client, body=DeviceRequest(
        platform=PlatformEnum.ANDROID, push_token=token))
    assert (r.status_code, r.parsed.push_token) == (201, token)

    # 3. An SMS (high, sensitive), an email and a push, as the README sends them.
    def send(body: SendRequestRequest, accepted_as: str = "queued") -> str:
        r = v1_notifications_create.sync_detailed(client=client, body=body, idempotency_key=uuid.uuid4().hex)
        assert r.status_code == 202, r.content
        assert r.parsed.status == accepted_as
        return str(r.parsed.id)

    otp = "Your code is 123456"
    sent = {
        send(SendRequestRequest(user_id=uid, channel=ChannelEnum.SMS, priority=PriorityEnum.HIGH, sensitive=True,
                                content=ContentRequest(body=otp))): ("sms", number, otp),
        **{send(SendRequestRequest(user_id=uid, channel=channel, content=ContentRequest(
            title="Hello", body="Welcome aboard"))): (channel.value, to, "Welcome aboard")
           for channel, to in ((ChannelEnum.EMAIL, email), (ChannelEnum.PUSH, token))},
    }

    # A typed send: the type's template renders the content; priority, category and sensitivity are
    # the type's. (Before the fix: 422 not_allowed_with_type on priority and sensitive.)
    r = v1_notification_types_update.sync_detailed(kind, client=client, body=NotificationTypeRequest(
        name="Order shipped", category="shipping", channels=[ChannelEnum.SMS], required_data=["order_id"],
        templates=[TypeTemplateRequest(channel=ChannelEnum.SMS, locale="en",
                                       body="Order {{ data.order_id }} shipped")]))
    assert r.status_code == 201, r.content
    typed_body = SendRequestRequest(user_id=uid, channel=ChannelEnum.SMS, type_=kind,
                                    data=SendRequestRequestData.from_dict({"order_id": "8812"}))
    typed = send(typed_body, accepted_as="scheduled")  # as an event's notifications are (docs/TYPES.md)
    sent[typed] = ("sms", number, "Order 8812 shipped")

    # What the "providers" received: exactly one message per send, to the recipient's contacts.
    wait_until(lambda: {m["notification_id"] for m in emulator.messages()} >= set(sent), 60,
               message="the emulator to receive the quick start's messages")
    received = [m for m in emulator.messages() if m["notification_id"] in sent]
    assert sorted((m["notification_id"], m["channel"], m["to"], m["body"]) for m in received) == sorted(
        (nid, *what) for nid, what in sent.items())

    # Read back through the client (its models parse the answer): sent, one attempt each.
    def status(nid: str):
        r = v1_notifications_retrieve.sync_detailed(uuid.UUID(nid), client=client)
        assert r.status_code == 200, r.content
        return r.parsed if r.parsed.status.value in SENT else None

    for nid, (channel, _, _) in sent.items():
        n = wait_until(lambda nid=nid: status(nid), 30, message=f"{channel} {nid} to be sent")
        assert (n.channel.value, n.attempts, "sent" in [e.status for e in n.timeline]) == (channel, 1, True)
    n = status(typed)
    assert (n.type_, n.priority, n.category, n.sensitive) == (kind, PriorityEnum.STANDARD, "shipping", False)
    assert n.content.body == "Order 8812 shipped"

    # The typed send with a priority of its own is still refused, naming the field.
    typed_body.priority = PriorityEnum.HIGH
    r = v1_notifications_create.sync_detailed(client=client, body=typed_body, idempotency_key=uuid.uuid4().hex)
    assert r.status_code == 422 and isinstance(r.parsed, Error)
    assert [(f.field, f.code) for f in r.parsed.error.fields] == [("priority", "not_allowed_with_type")]

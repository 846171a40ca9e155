"""First use, literally: the shell blocks of README.md's "Send a first notification" and "Events and
notification types", and docs/PROVIDERS.md's emulator fault examples (linked from the README), run
with bash against the started stack (real processes, bench/stack.py), and the answers they document.

The commands and curl bodies are read from README.md at test time and run with ``PORT`` and
``EMULATOR_PORT`` set to the stack's (the README's addresses are ``http://127.0.0.1:${PORT:-8000}``
and ``…:${EMULATOR_PORT:-8900}``); only ``<id>`` is replaced, by an id the README's own requests
returned, and each API client's name made unique (a name is taken once, and this test may run
again on the same database). ``curl`` is wrapped by a shell
function that records each call's arguments and HTTP status and prints the body as curl would, so
the commands run unchanged. If the README and the product disagree, this test fails.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from bench.stack import ROOT, wait_until
from core.vocabulary import CHANNELS
from notifications.inbox.models import InboxItem
from notifications.models import Notification
from preferences.models import Recipient
from tests.e2e import SENT, TERMINAL

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
SECTION = "### Send a first notification"
API, EMULATOR = "http://127.0.0.1:${PORT:-8000}", "http://127.0.0.1:${EMULATOR_PORT:-8900}"

# Records every curl call: arguments (NUL-separated) in N.args, HTTP status in N.status, body in
# N.body (then printed, as `curl -s` prints it).
CURL_TRACE = r"""
__n=0
curl() {
  __n=$((__n + 1))
  printf '%s\0' "$@" > "$TRACE/$__n.args"
  command curl -o "$TRACE/$__n.body" -w '%{http_code}' "$@" > "$TRACE/$__n.status"
  cat "$TRACE/$__n.body"
}
"""


def quickstart() -> tuple[list[str], str]:
    """The section's ```sh blocks and its prose (where the expected answers are written)."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S), section


def documented_answer(prose: str) -> tuple[int, dict]:
    """``Each answers `202 {"id": "…", "status": "queued"}` `` → (202, that object)."""
    match = re.search(r"Each answers `(\d{3}) (\{.*?\})`", prose)
    assert match, "README no longer documents the answer to the sends"
    return int(match.group(1)), json.loads(match.group(2))


def run(stack, script: str, trace: Path, **env: str) -> str:
    """Run ``script`` with bash in the repository root, ``PORT`` and ``EMULATOR_PORT`` the stack's and
    every ``create_api_client NAME`` given a unique name; returns its standard output."""
    assert "127.0.0.1:8000" not in script and "127.0.0.1:8900" not in script, "a hard-coded port"
    script = re.sub(r"create_api_client (\S+)", rf"create_api_client \1-{uuid.uuid4().hex[:6]}", script)
    ports = {"PORT": stack.api.rsplit(":", 1)[1], "EMULATOR_PORT": stack.emulator.rsplit(":", 1)[1]}
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", CURL_TRACE + script], cwd=ROOT,
                          env={**stack.env(), **ports, "TRACE": str(trace), **env}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def calls(trace: Path) -> list[dict]:
    """The recorded curl calls, in order: method, path, headers, JSON body sent; status and JSON answer."""
    out = []
    for n in range(1, len(list(trace.glob("*.args"))) + 1):
        args = (trace / f"{n}.args").read_text().split("\0")[:-1]
        call = {"method": "GET", "headers": {}, "sent": None, "url": next(a for a in args if a.startswith("http"))}
        for flag, value in itertools.pairwise(args):
            if flag == "-X":
                call["method"] = value
            elif flag == "-H":
                name, _, header = value.partition(":")
                call["headers"][name.strip().lower()] = header.strip()
            elif flag == "-d":
                call["sent"] = json.loads(value)
        call["status"] = int((trace / f"{n}.status").read_text())
        call["answer"] = json.loads((trace / f"{n}.body").read_text())
        out.append(call)
    return out


def matches(shape: dict, answer: dict) -> bool:
    """The README's example object: same keys; "…" stands for any value."""
    return set(answer) == set(shape) and all(v == "…" or answer[k] == v for k, v in shape.items())


def test_the_readme_opening_names_every_channel():
    """What the platform reaches users by, in the README's first paragraph (``in_app`` was missing)."""
    opening = README.read_text().split("## Quick start", 1)[0].lower()
    assert [channel for channel in CHANNELS if channel not in opening] == []


def test_the_readme_quick_start_works_as_written(emulator, live_db, tmp_path):
    stack = emulator
    blocks, prose = quickstart()
    assert len(blocks) == 2, blocks
    setup, look = blocks
    assert API in setup and EMULATOR in look
    status, shape = documented_answer(prose)

    # 1–3 as written: the API key, the recipient and device, the three sends.
    (trace := tmp_path / "setup").mkdir()
    run(stack, setup, trace)
    made = calls(trace)
    user = next(c for c in made if c["method"] == "PUT" and c["url"].endswith("/v1/users/alice"))
    device = next(c for c in made if c["url"].endswith("/v1/users/alice/devices"))
    assert (user["status"], device["status"]) in {(200, 201), (201, 201)}, (user, device)
    sends = [c for c in made if c["method"] == "POST" and c["url"].endswith("/v1/notifications")]
    assert [c["sent"]["channel"] for c in sends] == list(CHANNELS)  # the first use shows every channel
    for call in sends:
        assert (call["status"], matches(shape, call["answer"])) == (status, True), call
        uuid.UUID(call["answer"]["id"])
    key = sends[0]["headers"]["authorization"].removeprefix("Api-Key ")

    # What the "providers" received: exactly one message per provider send, to alice's contacts; the
    # in_app one is alice's inbox item, as the README says.
    inbox = next(c for c in sends if c["sent"]["channel"] == "in_app")
    item = wait_until(lambda: InboxItem.objects.filter(pk=inbox["answer"]["id"]).first(), 60,
                      message="the quick start's in_app item")
    assert (item.recipient_id, item.title, item.body) == ("alice", "Hello", "Welcome aboard")
    ids = {c["answer"]["id"]: c for c in sends if c is not inbox}
    wait_until(lambda: {m["notification_id"] for m in stack.messages()} >= set(ids), 60,
               message="the emulator to receive the three quick-start messages")
    (trace := tmp_path / "look").mkdir()
    emulator_line, status_line, inbox_line = [line for line in look.splitlines() if line.startswith("curl")]
    received = [m for m in json.loads(run(stack, emulator_line, trace)) if m["notification_id"] in ids]
    to = {"sms": user["sent"]["phone"], "email": user["sent"]["email"], "push": device["sent"]["push_token"]}
    assert sorted((m["notification_id"], m["channel"], m["to"], m["body"]) for m in received) == sorted(
        (nid, c["sent"]["channel"], to[c["sent"]["channel"]], c["sent"]["content"]["body"]) for nid, c in ids.items())

    # Status and timeline of the SMS, as the README's second command asks for them (same shell: $KEY).
    sms_id = sends[0]["answer"]["id"]
    wait_until(lambda: json.loads(run(stack, status_line.replace("<id>", sms_id), trace, KEY=key))["status"] in SENT,
               30, message="the SMS to be sent")
    detail = calls(trace)[-1]
    assert (detail["status"], detail["answer"]["id"], detail["answer"]["attempts"]) == (200, sms_id, 1)
    assert "sent" in [event["status"] for event in detail["answer"]["timeline"]]

    # alice's inbox, read as the README shows it: a key of scope inbox, then the inbox holds the item.
    (key_line,) = [line for line in look.splitlines() if "create_api_client" in line]
    assert "--scopes inbox" in key_line
    listed = json.loads(run(stack, f"{key_line}\n{inbox_line}", trace))
    assert calls(trace)[-1]["status"] == 200
    assert [(i["id"], i["title"], i["body"]) for i in listed["items"] if i["id"] == inbox["answer"]["id"]] == [
        (inbox["answer"]["id"], "Hello", "Welcome aboard")]


PROVIDERS_DOC = ROOT / "docs" / "PROVIDERS.md"
FAULTS_SECTION = "## The emulator: provider faults on demand"


def test_the_readme_points_to_the_fault_examples():
    """The README's faults paragraph links the section the examples moved to (by its anchor)."""
    readme = README.read_text()
    assert "### Provider faults on demand (the emulator)" in readme
    assert "(docs/PROVIDERS.md#the-emulator-provider-faults-on-demand)" in readme
    assert FAULTS_SECTION in PROVIDERS_DOC.read_text()


def test_the_fault_examples_work_as_written(api, emulator, tmp_path):
    """docs/PROVIDERS.md's fault examples (linked from the README's quick start), run as written."""
    stack = emulator
    text = PROVIDERS_DOC.read_text()
    assert FAULTS_SECTION in text
    block = re.findall(r"```sh\n(.*?)```", text.split(FAULTS_SECTION, 1)[1], flags=re.S)[0]
    assert EMULATOR in block
    *rules_and_list, clear = [line for line in block.splitlines() if line.strip()]
    assert "-X DELETE" in clear

    # Every example rule is accepted as written and listed back as posted.
    (trace := tmp_path / "faults").mkdir()
    run(stack, "\n".join(rules_and_list), trace)
    made = calls(trace)
    posted = [c for c in made if c["method"] == "POST"]
    assert len(posted) >= 5 and [c["status"] for c in posted] == [201] * len(posted), posted
    listed = next(c for c in made if c["method"] == "GET")["answer"]
    assert [{k: rule[k] for k in c["sent"]} for rule, c in zip(listed, posted, strict=True)] == [c["sent"] for c in
                                                                                               posted]

    # The first example does what its comment says: Twilio refuses that number with 21211, so the SMS
    # fails (no retry) and the number is marked invalid.
    number = posted[0]["sent"]["to"]
    api.put_user("readme-faults", phone=number)
    r = api.send({"user_id": "readme-faults", "channel": "sms", "content": {"body": "hello"}})
    assert r.status_code == 202, r.text
    n = wait_until(lambda: Notification.objects.filter(pk=r.json()["id"], status__in=TERMINAL).first(), 30,
                   message="the SMS to end")
    assert (n.status, n.reason, n.attempts) == ("failed", "contact_invalid", 1)
    assert Recipient.objects.get(pk="readme-faults").phone_invalid_reason == "invalid_number"
    assert stack.messages(notification_id=str(n.pk)) == []

    # The last line removes them all.
    run(stack, clear, trace)
    assert requests.get(f"{stack.emulator}/_emulator/faults", timeout=5).json() == []


EVENTS_SECTION = "## Events and notification types"


def test_the_readme_events_example_works_as_written(emulator, live_db, tmp_path):
    """The events section's two blocks, as written: a key, a user without a device, a fallback type
    (push, then email), an event; then the event's story: the push suppressed for want of a device,
    the email sent instead. Besides the client's name (:func:`run`), only the type's key is made
    unique (a type belongs to the key that defined it, and this test may run again on the same
    database)."""
    stack = emulator
    text = README.read_text()
    section = re.split(r"\n#{2,3} ", text.split(EVENTS_SECTION, 1)[1], maxsplit=1)[0]
    setup, look = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    kind = f"order_shipped_{uuid.uuid4().hex[:6]}"
    (trace := tmp_path / "events").mkdir()
    run(stack, setup.replace("order_shipped", kind), trace)
    made = calls(trace)
    assert [(c["method"], c["status"]) for c in made] in (
        [("PUT", 201), ("PUT", 201), ("POST", 202)], [("PUT", 200), ("PUT", 201), ("POST", 202)]), made
    accepted = made[-1]["answer"]
    assert re.search(r"It answers `202 \{\"id\": \"…\", \"type\": \"order_shipped\", \"notifications\"", section)
    assert [(n["channel"], n["status"], n["reason"]) for n in accepted["notifications"]] == [
        ("push", "scheduled", ""), ("email", "scheduled", "fallback_waiting")]
    key = made[0]["headers"]["authorization"].removeprefix("Api-Key ")
    email_id = accepted["notifications"][1]["id"]
    wait_until(lambda: Notification.objects.filter(pk=email_id, status__in=SENT).exists(), 30,
               message="the email sent instead of the push")
    story = json.loads(run(stack, look.replace("<id>", accepted["id"]), trace, KEY=key))
    (bob,) = story["recipients"]
    assert bob["outcome"] == "reached"
    assert [(n["channel"], n["reason"]) for n in bob["notifications"]] == [("push", "no_active_device"),
                                                                           ("email", "")]
    (mail,) = stack.messages(notification_id=email_id)
    assert (mail["to"], mail["title"], mail["body"]) == ("bob@example.com", "Order 8812 shipped",
                                                        "Hi Bob, track it: https://t.example/8812")

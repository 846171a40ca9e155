"""The reference points the platform is compared with, measured in the same run on the same emulator.

``mode="sdk"`` (for email the raw ceiling): the platform's own ``send_batch`` in a tight loop, no
database, no queue; ``mode="durable"``: the least an at-least-once design must do (COPY the rows,
``send_batch``, one UPDATE to ``sent``); ``mode="http"``: pooled aiohttp, no SDK (informative).
:func:`run_ceiling` starts :data:`STANDARD_PROCESSES` processes of ``python -m bench.ceilings`` that
start together and each print one JSON line; the parent samples the emulator's, Postgres's and
Redis's CPU meanwhile. What each ceiling means: docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BATCH = {"email": 500, "sms": 100, "push": 100}
READY = "ready"
#: ``category`` of the durable ceiling's rows, so they can be deleted after the measurement.
DURABLE_CATEGORY = "bench-durable-ceiling"


def batch_size_and_concurrency(channel: str) -> tuple[int, int]:
    """``settings.NOTIFY["BATCH_SIZE"][channel]`` and ``["SEND_CONCURRENCY"][channel]``; before the
    pipeline defines them: the standard chunk and 1."""
    from django.conf import settings

    notify = settings.NOTIFY
    if "BATCH_SIZE" in notify:
        size = int(notify["BATCH_SIZE"][channel])
    else:  # an older pipeline: its standard chunk
        try:
            from notifications import enqueue
        except ImportError:
            enqueue = None
        size = int(getattr(enqueue, "STANDARD_CHUNK", DEFAULT_BATCH[channel]))
    concurrency = int(notify.get("SEND_CONCURRENCY", {}).get(channel, 1))
    return size, concurrency


def build_messages(channel: str, count: int, tag: str) -> list:
    from providers.base import OutboundMessage

    out = []
    for i in range(count):
        nid = str(uuid.uuid4())
        if channel == "email":
            out.append(OutboundMessage(notification_id=nid, channel="email", to=f"raw-{tag}-{i}@example.com",
                                       title="Hello", body=f"Hello U{i}", data={"notification_id": nid}))
        elif channel == "sms":
            out.append(OutboundMessage(notification_id=nid, channel="sms", to=f"+49152{i % 10**8:08d}",
                                       body=f"Hello U{i}"))
        else:
            out.append(OutboundMessage(notification_id=nid, channel="push", to=f"raw-token-{tag}-{i}",
                                       title="Hello", body=f"Hello U{i}", platform="android", collapse_key=nid))
    return out


def sender(channel: str):
    """``(function(batch) -> results, "native")``: the backend's ``send_batch`` with the platform's
    send concurrency, exactly as the standard worker calls it."""
    from providers.registry import get_backend

    backend = get_backend(channel)
    _, concurrency = batch_size_and_concurrency(channel)
    return (lambda batch: backend.send_batch(batch, concurrency=concurrency)), "native"


def durable_sender(channel: str, send):
    """``send`` wrapped in the durable minimum, per batch: COPY the rows as ``queued`` (committed),
    ``send`` them (their ``notification_id`` set to the row ids), then one UPDATE marking the accepted
    ones ``sent`` (provider, message id, ``sent_at``) and the refused ones ``failed``. Rows belong to
    existing recipients (the bench's seeded ones) and carry :data:`DURABLE_CATEGORY`."""
    import dataclasses

    from django.db import connection

    from bench.seed import copy_rows
    from notifications.models import Notification
    from preferences.models import Recipient

    recipients = list(Recipient.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    if not recipients:
        raise RuntimeError("the durable ceiling needs seeded recipients")

    def run(batch):
        now = datetime.now(UTC)
        ids = [uuid.uuid4() for _ in batch]
        copy_rows(Notification, ({"id": nid, "recipient_id": recipients[i % len(recipients)], "channel": channel,
                                  "priority": "standard", "category": DURABLE_CATEGORY, "title": m.title or "",
                                  "body": m.body, "status": "queued", "queued_at": now, "created_at": now,
                                  "updated_at": now} for i, (nid, m) in enumerate(zip(ids, batch, strict=True))),
                  conflict_free=True)
        results = send([dataclasses.replace(m, notification_id=str(nid)) for nid, m in zip(ids, batch, strict=True)])
        ok = [(str(nid), r.provider, r.provider_message_id)
              for nid, r in zip(ids, results, strict=True) if not isinstance(r, Exception)]
        failed = [str(nid) for nid, r in zip(ids, results, strict=True) if isinstance(r, Exception)]
        with connection.cursor() as cur:
            cur.execute("UPDATE notifications_notification AS n SET status = 'sent', provider = v.provider, "
                        "provider_message_id = v.message_id, sent_at = now(), updated_at = now(), attempts = 1 "
                        "FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS v(id, provider, message_id) "
                        "WHERE n.id = v.id", [[o[0] for o in ok], [o[1] for o in ok], [o[2] for o in ok]])
            if failed:
                cur.execute("UPDATE notifications_notification SET status = 'failed', updated_at = now() "
                            "WHERE id = ANY(%s::uuid[])", [failed])
        return results

    return run


def delete_durable_rows() -> int:
    """Delete the durable ceiling's rows (and vacuum), so the blast that follows starts from the same
    table as without the measurement. Returns how many rows were deleted."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("DELETE FROM notifications_notification WHERE category = %s", [DURABLE_CATEGORY])
        deleted = cur.rowcount
        cur.execute("VACUUM ANALYZE notifications_notification")
    return deleted


def http_sender(channel: str, concurrency: int):
    """What would lift the SMS/push ceiling, measured: the same requests the SDKs make (Twilio's
    form POST, FCM's JSON ``messages:send``) over one pooled keep-alive aiohttp session with
    ``concurrency`` in flight, without the SDKs' requests/urllib3/google-auth stacks. Returns
    ``(function(batch) -> results, "aiohttp")``; results are True or an exception."""
    import asyncio

    import aiohttp
    from django.conf import settings

    entry = settings.PROVIDERS[channel][0]
    options = entry["OPTIONS"]
    loop = asyncio.new_event_loop()
    session = None

    async def open_session():
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

    def request_for(m):
        if channel == "sms":
            url = f"{options['BASE_URL']}/2010-04-01/Accounts/{options['ACCOUNT_SID']}/Messages.json"
            return url, {"data": {"To": m.to, "From": options["FROM_NUMBER"], "Body": m.body},
                         "auth": aiohttp.BasicAuth(options["ACCOUNT_SID"], options["AUTH_TOKEN"])}
        url = options["FCM_URL"].format(options["PROJECT_ID"])
        body = {"message": {"token": m.to, "notification": {"title": m.title, "body": m.body},
                            "data": {"notification_id": m.notification_id},
                            "android": {"collapse_key": m.collapse_key, "priority": "normal"}}}
        return url, {"json": body, "headers": {"Authorization": "Bearer raw-probe"}}

    async def one(m):
        url, kwargs = request_for(m)
        try:
            async with session.post(url, **kwargs) as response:
                await response.read()
                return True if response.status < 300 else RuntimeError(f"HTTP {response.status}")
        except Exception as exc:
            return exc

    async def many(batch):
        return await asyncio.gather(*(one(m) for m in batch))

    session = loop.run_until_complete(open_session())
    return (lambda batch: loop.run_until_complete(many(batch))), "aiohttp"


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--tag", default="0")
    parser.add_argument("--prebuild", type=int, default=0)
    parser.add_argument("--mode", choices=("sdk", "durable", "http"), default="sdk")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    size, concurrency = batch_size_and_concurrency(args.channel)
    if args.mode == "http":
        send, kind = http_sender(args.channel, max(concurrency, 8))
    else:
        send, kind = sender(args.channel)
    if args.mode == "durable":
        send = durable_sender(args.channel, send)
    prebuild = args.prebuild or (200_000 if args.channel == "email" else 20_000)
    messages = build_messages(args.channel, prebuild, args.tag)
    batches = [messages[i:i + size] for i in range(0, len(messages), size)]
    # A whole batch before the clock starts: every pool thread opens its backend (connections, OAuth
    # tokens, FCM credentials) outside the measured window, as in a warmed-up worker.
    send(batches[0])
    # Ready: the parent answers with the common start instant once every process is ready.
    print(READY, flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    end = start_at + args.seconds
    cpu0, t0 = time.process_time(), time.time()
    sent = ok = errors = 0
    first_error = None
    i = 0
    while time.time() < end:
        batch = batches[i % len(batches)]
        i += 1
        for result in send(batch):
            sent += 1
            if isinstance(result, Exception):
                errors += 1
                first_error = first_error or repr(result)[:300]
            else:
                ok += 1
    print(json.dumps({"messages": sent, "ok": ok, "errors": errors, "first_error": first_error,
                      "seconds": round(time.time() - t0, 3), "cpu_s": round(time.process_time() - cpu0, 3),
                      "batch_size": size, "concurrency": concurrency, "send_batch": kind}), flush=True)
    return 0


#: Pool processes of the standard worker (Procfile / bench/stack.py: --concurrency 4).
STANDARD_PROCESSES = 4


def run_ceiling(channel: str, env: dict[str, str], monitor, seconds: float = 15.0,
                processes: int = STANDARD_PROCESSES, mode: str = "sdk") -> dict:
    """Run the ``mode`` loop (see the module docstring) in ``processes`` processes for ``seconds``
    (``monitor``: a ProcessMonitor watching the emulator, Postgres and Redis). Returns msgs/s
    (accepted messages over the loop's wall time) and CPU-µs per accepted message: the loop
    processes' own (``client``), the emulator's, and Postgres + Redis (``database``)."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.ceilings", "--channel", channel,
                               "--seconds", str(seconds), "--tag", str(i),
                               "--mode", mode],
                              cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    # Django setup, message building and the first connection happen before the common start.
    for proc in procs:
        line = "?"
        while line and line.strip() != READY:
            line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            raise RuntimeError(f"{mode} ceiling process exited before the start ({proc.returncode}): "
                               f"{proc.stderr.read()[-2000:]}")
    start_at = time.time() + 0.5
    for proc in procs:
        proc.stdin.write(f"{start_at}\n")
        proc.stdin.flush()
    time.sleep(max(0.0, start_at - time.time()))
    monitor.mark("raw_start")
    time.sleep(seconds)
    monitor.mark("raw_end")
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 120)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{mode} ceiling process failed ({proc.returncode}): {err[-2000:]}")
        results.append(json.loads(lines[-1]))
    cpu = monitor.cpu_between("raw_start", "raw_end")
    messages = sum(r["messages"] for r in results)
    ok = sum(r["ok"] for r in results)
    wall = max(r["seconds"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    return {
        "channel": channel, "mode": mode, "processes": processes, "seconds": round(wall, 2),
        "batch_size": results[0]["batch_size"], "concurrency": results[0]["concurrency"],
        "send_batch": results[0]["send_batch"], "messages": messages, "accepted": ok,
        "errors": messages - ok, "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "msgs_per_s": round(ok / wall, 1) if wall else None,
        "client_cpu_us_per_msg": round(client_cpu * 1e6 / ok, 1) if ok else None,
        "emulator_cpu_us_per_msg": round(cpu.get("emulator", 0.0) * 1e6 / ok, 1) if ok else None,
        "database_cpu_us_per_msg": (round((cpu.get("postgres", 0.0) + cpu.get("redis", 0.0)) * 1e6 / ok, 1)
                                    if ok else None),
    }


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))

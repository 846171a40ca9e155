"""The event blast: its figures, sanity checks and docs block from synthetic inputs (bench.event_report),
its plot, ``--write-docs`` routing an events run to its own block, and the event sender's retries
against a stub API (no platform, no timed assertion)."""

import asyncio
import json
import socket
import threading

import pytest
from aiohttp import web

from bench import event_report, plot, report
from bench.event_sender import EventSender, event_data, expected_content, type_definition

L = 1_700_000_000_000.0  # launch, ms; a whole second
KINDS = ("web", "worker_standard", "postgres", "redis")


def _sends():
    return [
        {"index": 0, "user_id": "u0", "start_ms": L, "end_ms": L + 100, "status": 202, "attempts": 1,
         "ids": {"push": "p0", "email": "m0"}, "error": None},
        {"index": 1, "user_id": "u1", "start_ms": L + 100, "end_ms": L + 1100, "status": 202, "attempts": 1,
         "ids": {"push": "p1", "email": "m1"}, "error": None},
        {"index": 2, "user_id": "u2", "start_ms": L + 200, "end_ms": L + 1200, "status": 202, "attempts": 2,
         "ids": {"push": "p2", "email": "m2"}, "error": None},
        {"index": 3, "user_id": "u3", "start_ms": L + 300, "end_ms": L + 400, "status": 503, "attempts": 3,
         "ids": {}, "error": "Service Unavailable"},
    ]


def _otps():
    return [{"id": "o0", "channel": "email", "accept_ms": L - 1000, "api_ms": 5.0},
            {"id": "o1", "channel": "email", "accept_ms": L + 50, "api_ms": 7.0},
            {"id": None, "channel": "email", "accept_ms": L + 60, "status": 500, "error": "boom", "api_ms": 3.0}]


def _received():
    # p1 arrived twice (a duplicate); m2 never arrived.
    return {"p0": [int(L) + 500], "m0": [int(L) + 700], "p1": [int(L) + 1500, int(L) + 1600],
            "m1": [int(L) + 2100], "p2": [int(L) + 2500], "o0": [int(L) - 960], "o1": [int(L) + 150]}


def _run(**overrides):
    kwargs = dict(
        launch_ms=L, end_ms=L + 3000, sends=_sends(),
        statuses={"push": {"sent": 3}, "email": {"sent": 2, "sending": 1}},
        received=_received(), by_provider={"fcm": 4, "sendgrid": 5, "twilio": 0, "smtp": 0}, otp_records=_otps(),
        cpu={"web": 0.3, "worker_standard": 0.6, "postgres": 0.3, "redis": 0.0, "emulator": 0.03},
        client_cpu_seconds=0.15, rss={"worker_standard": [(L / 1000 + t, 100 * 1024 * 1024) for t in range(4)]},
        platform_kinds=KINDS, requested=4)
    kwargs.update(overrides)
    return event_report.summarize_events(**kwargs)


def test_accept_figures_count_the_202s_from_the_first_post():
    accept = _run()["accept"]
    assert accept == {
        "requested": 4, "time_boxed": False, "sent": 4, "accepted": 3, "refused": 1,
        "refused_examples": ["Service Unavailable"], "retried": 2, "seconds": 1.2,
        # 202s at +0.1, +1.1 and +1.2 s: 3 in 1.2 s; per second [1, 2]
        "events_per_s": {"mean": 2.5, "p50": 1.5, "peak": 2},
        "latency_ms": {"count": 3, "p50": 1000.0, "p95": 1000.0, "p99": 1000.0, "max": 1000.0, "mean": 700.0}}


def test_delivery_per_channel_counts_first_arrivals_and_names_what_never_arrived():
    run = _run()
    assert run["delivery"]["push"] == {
        "expected": 3, "delivered": 3, "per_s": {"mean": 1.2, "p50": 1.0, "peak": 1},
        "accept_to_provider_ms": {"count": 3, "p50": 1400.0, "p95": 2210.0, "p99": 2282.0, "max": 2300.0,
                                  "mean": 1400.0},
        "first_delivery_seconds": 0.5, "last_delivery_seconds": 2.5}
    assert run["delivery"]["email"]["expected"] == 3 and run["delivery"]["email"]["delivered"] == 2
    assert run["lost"] == {"total": 1, "by_channel": {
        "email": {"total": 1, "not_sent": 1, "sent_not_seen_by_provider": 0, "examples": ["m2"]},
        "push": {"total": 0, "not_sent": 0, "sent_not_seen_by_provider": 0, "examples": []}}}
    assert run["duplicates"] == {"messages": 1, "ids": 1, "examples": ["p1"]}
    # fcm 4 + sendgrid 5 messages: 6 of the blast's ids, 2 OTP emails, 1 nobody asked for.
    assert run["other_messages"] == 1


def test_an_event_is_delivered_when_its_last_channel_arrives():
    delivered = _run()["delivered"]
    assert delivered == {
        "notifications": 5, "notifications_per_s": {"mean": 2.0, "p50": 2.0, "peak": 2},
        # e0 complete at +0.7 s, e1 at +2.1 s; e2's email never came
        "events": 2, "events_per_s": {"mean": 1.0, "p50": 1.0, "peak": 1},
        "first_accept_to_last_delivery_seconds": 2.4, "last_accept_to_last_delivery_seconds": 1.3,
        "undelivered_at_last_accept": 4}


def test_cpu_per_event_and_per_notification_by_process_kind():
    cpu = _run()["cpu"]
    assert cpu["platform_seconds"] == 1.2
    assert cpu["platform_cpu_us_per_event"] == 400_000.0  # 1.2 CPU-s over 3 accepted events
    assert cpu["platform_cpu_us_per_notification"] == 240_000.0  # over 5 delivered notifications
    assert cpu["cpu_us_per_event_by_kind"] == {"web": 100_000.0, "worker_standard": 200_000.0,
                                               "postgres": 100_000.0, "redis": 0.0, "emulator": 10_000.0}
    assert (cpu["emulator_cpu_us_per_event"], cpu["client_cpu_us_per_event"]) == (10_000.0, 50_000.0)


def test_otp_figures_cover_the_blast_window_and_the_timeline_is_per_second_from_launch():
    run = _run()
    otp = run["otp"]
    assert (otp["sent"], otp["accepted"], otp["refused"], otp["delivered"], otp["missing"]) == (3, 2, 1, 2, 0)
    assert otp["latency_ms"]["count"] == 1 and otp["latency_ms"]["p99"] == 100.0
    assert otp["latency_ms_before_launch"]["p50"] == 40.0
    assert otp["api_ms"] == {"count": 1, "p50": 7.0, "p95": 7.0, "p99": 7.0, "max": 7.0, "mean": 7.0}
    tl = run["timeline"]
    assert tl["start_s"] == 0.0
    assert tl["accepted_per_s"] == [1, 2, 0, 0]
    assert tl["delivered_per_s"] == {"email": [1, 0, 1, 0], "push": [1, 1, 1, 0]}
    assert tl["otp"] == [[-1.0, 40.0, "email"], [0.05, 100.0, "email"]]


def test_sanity_fails_on_refusals_losses_content_and_otps_but_not_on_duplicates():
    events = {"run": _run(), "content_checks": [{"id": "p0", "ok": True}, {"id": "m0", "ok": False}]}
    problems = event_report.event_sanity_problems(events)
    assert [p.split(" ")[0:2] for p in problems] == [["1", "event(s)"], ["lost", "1"], ["1", "message(s)"],
                                                     ["1", "OTP(s)"]]
    clean = _run(sends=_sends()[:2], statuses={"push": {"sent": 2}, "email": {"sent": 2}},
                 otp_records=_otps()[:2])
    assert clean["duplicates"]["messages"] == 1
    assert event_report.event_sanity_problems({"run": clean, "content_checks": [{"ok": True}]}) == []
    assert event_report.event_sanity_problems({"run": {**clean, "timed_out": True}}) == [
        "the event blast did not drain before the timeout"]
    assert event_report.event_sanity_problems(None) == ["the event blast did not complete"]


def _report():
    return {"scenario": "events", "started_at": "2026-12-02T08:00:00+00:00", "git": {"commit": "abcdef1234567"},
            "machine": {"cores": 2}, "options": {"argv": "--scenario events --events 4"},
            "events": {"events": 4, "concurrency": 8, "run": _run(send_time_boxed=True),
                       "machine_window": {"busy_pct": 99.0, "platform_pct": 60.0, "steal_pct": 0.1}},
            "sanity": {"problems": []}}


def test_docs_section_gives_the_command_and_the_figures():
    text = event_report.docs_section(_report(), "r.json", "PERFORMANCE-events.png", KINDS)
    lines = text.splitlines()
    assert lines[0] == event_report.EVENTS_START and lines[-1] == event_report.EVENTS_END
    assert "Command: `python manage.py bench --scenario events --events 4`." in lines
    assert "| events accepted / sent / requested | 3 / 4 / 4 (sending time-boxed) |" in lines
    assert "| accept: events/s mean (p50 of seconds) | 2.5 (1.5) |" in lines
    assert "| push: delivered/s mean (p50 of seconds) | 1.2 (1.0) |" in lines
    assert "| push: event POST → provider p50 / p99 (s) | 1.40 / 2.28 |" in lines
    assert "| first accept → last delivery (s) | 2.4 |" in lines
    assert "| worker_standard | 200,000 |" in lines and "| bench client (apart) | 50,000 |" in lines
    assert "| redis | 0 |" in lines
    assert "the platform's processes 60.0 % of it" in lines[1]


def test_the_events_block_is_replaced_beside_the_results_block():
    text = (f"# Perf\n{report.DOCS_START}\nruns\n{report.DOCS_END}\n\n## Event blast\n\n"
            f"{event_report.EVENTS_START}\nold\n{event_report.EVENTS_END}\n")
    out = report.replace_docs_section(text, "NEW", event_report.EVENTS_START, event_report.EVENTS_END)
    assert out == f"# Perf\n{report.DOCS_START}\nruns\n{report.DOCS_END}\n\n## Event blast\n\nNEW\n"


def test_write_docs_sends_an_events_run_to_its_block_and_a_blast_to_the_results(tmp_path, settings):
    from bench.management.commands.bench import Command

    (tmp_path / "docs").mkdir()
    docs = tmp_path / "docs" / "PERFORMANCE.md"
    docs.write_text(f"# Perf\n{report.DOCS_START}\nold runs\n{report.DOCS_END}\n\n## Event blast\n\n"
                    f"{event_report.EVENTS_START}\nold events\n{event_report.EVENTS_END}\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "e.json").write_text(json.dumps(_report()))
    (results / "e.png").write_bytes(b"png-events")
    (results / "b.json").write_text(json.dumps({"scenario": "blast", "options": {"channel": "email"}}))
    settings.BASE_DIR = tmp_path
    Command().write_docs([results / "b.json", results / "e.json"])
    text = docs.read_text()
    assert "old runs" not in text and "old events" not in text
    assert text.index("Run `b.json`") < text.index("## Event blast") < text.index("Run `e.json`")
    assert (tmp_path / "docs" / "PERFORMANCE-events.png").read_bytes() == b"png-events"
    assert not (tmp_path / "docs" / "PERFORMANCE.png").exists()  # b.json has no plot


def test_events_plot_is_written(tmp_path):
    path = tmp_path / "events.png"
    plot.write_events_plot(_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot.write_events_plot({"events": None}, tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_the_templates_and_the_expected_content_agree_on_the_words():
    templates = {t["channel"]: t for t in type_definition()["templates"]}
    assert set(templates) == {"push", "email"}
    assert expected_content("push", 7, "U7") == ("Order B0000007 shipped", "Hi U7, order B0000007 is on its way")
    assert expected_content("email", 7, "U7") == ("Order B0000007 shipped",
                                                  "Hi U7, track it: https://track.example/B0000007")
    assert event_data(7) == {"order_id": "B0000007", "tracking_url": "https://track.example/B0000007"}


# --- the sender against a stub API --------------------------------------------------------------

@pytest.fixture
def stub_api():
    """``POST /v1/events`` answering 503 to the first request of user ``flaky``, 422 to user ``bad``,
    202 otherwise; ``seen`` lists ``(user_id, Idempotency-Key)`` of every request."""
    seen: list[tuple[str, str]] = []

    async def events(request):
        body = await request.json()
        user, key = body["user_id"], request.headers["Idempotency-Key"]
        seen.append((user, key))
        if user == "bad":
            return web.json_response({"errors": [{"field": "user_id"}]}, status=422)
        if user == "flaky" and sum(1 for u, _k in seen if u == "flaky") == 1:
            return web.Response(status=503, text="try again")
        return web.json_response({"id": "e", "type": body["type"], "notifications": [
            {"id": f"{user}-push", "channel": "push"}, {"id": f"{user}-email", "channel": "email"}]}, status=202)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/events", events)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", seen
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def test_the_sender_retries_with_the_same_key_and_records_each_event(stub_api):
    api, seen = stub_api
    sender = EventSender(api, "k", ["ok", "flaky", "bad"], concurrency=2)
    sender.start()
    sender.join(30)
    assert sender.done.is_set() and sender.error is None
    by_user = {r["user_id"]: r for r in sender.records}
    assert {u: (r["status"], r["attempts"]) for u, r in by_user.items()} == {
        "ok": (202, 1), "flaky": (202, 2), "bad": (422, 1)}
    assert by_user["flaky"]["ids"] == {"push": "flaky-push", "email": "flaky-email"}
    assert by_user["flaky"]["error"] is None
    assert by_user["bad"]["ids"] == {} and "user_id" in by_user["bad"]["error"]
    keys = {u: [k for v, k in seen if v == u] for u in ("ok", "flaky", "bad")}
    assert len(keys["flaky"]) == 2 and keys["flaky"][0] == keys["flaky"][1]
    assert len({keys["ok"][0], keys["flaky"][0], keys["bad"][0]}) == 3

"""The event blast's figures, sanity checks, summary and docs block (docs/PERFORMANCE.md, "Event
blast"): pure functions of what a run collected, tested in ``tests/test_bench_events.py``.

Instants are client-clock epoch ms (the bench, the API and the emulator share one machine and clock).
The blast starts at the first event's POST (``start_ms`` of the earliest send); an event is
*accepted* when its 202 arrives (``end_ms``) and *delivered* when every one of its notifications has
reached the emulator (the first arrival of each notification id).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bench.report import memory_summary
from bench.stats import bucket_series, latency_summary, otp_latencies, rate_summary, series_from_times

SENT = ("sent", "delivered")
#: The emulator's provider of each of the event type's channels.
PROVIDER = {"push": "fcm", "email": "sendgrid"}
EVENTS_START = "<!-- bench:events:start -->"
EVENTS_END = "<!-- bench:events:end -->"


def _seconds(a_ms: float | None, b_ms: float | None) -> float | None:
    return None if a_ms is None or b_ms is None else round((b_ms - a_ms) / 1000, 2)


def _per_second(times_ms: Iterable[float], first_ms: float, last_ms: float) -> list[int]:
    """Counts per whole second of the epoch, from the second holding ``first_ms`` to the one holding
    ``last_ms``."""
    return bucket_series(series_from_times((int(t) for t in times_ms), 1000), int(first_ms), int(last_ms), 1000)


def _rate(times_ms: Sequence[float], origin_ms: float) -> dict:
    """``{mean, p50, peak}`` of events at ``times_ms``: mean = count ÷ (last − origin); p50 and peak of
    the per-second counts between the first and the last instant."""
    if not times_ms:
        return rate_summary(0, None, [])
    last = max(times_ms)
    return rate_summary(len(times_ms), _seconds(origin_ms, last), _per_second(times_ms, min(times_ms), last))


def summarize_events(*, launch_ms: float, end_ms: float, sends: Sequence[dict], statuses: dict[str, dict[str, int]],
                     received: dict[str, list[int]], by_provider: dict[str, int], otp_records: Sequence[dict],
                     cpu: dict[str, float], client_cpu_seconds: float | None,
                     rss: dict[str, list[tuple[float, int]]], platform_kinds: Iterable[str],
                     requested: int | None = None, send_time_boxed: bool = False, timed_out: bool = False) -> dict:
    """Every figure of one event blast.

    ``sends``: :class:`bench.event_sender.EventSender` records (``start_ms``, ``end_ms``, ``status``,
    ``attempts``, ``ids`` = ``{channel: notification id}``, ``error``); ``statuses``: the blast's
    notifications per channel and status in the database at the end; ``received``: the emulator's
    arrival instants per notification id (the analysis's ``received_at_ms`` for the blast's and the
    OTPs' ids); ``by_provider``: every message the emulator holds, per provider; ``otp_records``: the
    OTP sender's; ``cpu``: CPU seconds per process kind over launch → end; ``client_cpu_seconds``: the
    bench process's own (event and OTP senders, monitor); ``rss``: RSS samples per kind;
    ``requested``: the events the run was asked to send (``len(sends)`` when omitted);
    ``send_time_boxed``: the sending was stopped before all of them (``--send-seconds``).
    """
    accepted = [s for s in sends if s.get("status") == 202]
    refused = [s for s in sends if s.get("status") != 202]
    origin = min((s["start_ms"] for s in sends), default=launch_ms)
    accept_times = [s["end_ms"] for s in accepted]
    first_accept = min(accept_times, default=None)
    last_accept = max(accept_times, default=None)
    accept = {
        "requested": len(sends) if requested is None else requested, "time_boxed": send_time_boxed,
        "sent": len(sends), "accepted": len(accepted), "refused": len(refused),
        "refused_examples": [s.get("error") or s.get("status") for s in refused[:3]],
        "retried": sum(1 for s in sends if s.get("attempts", 1) > 1),
        "seconds": _seconds(origin, last_accept),
        "events_per_s": _rate(accept_times, origin),
        "latency_ms": latency_summary([s["end_ms"] - s["start_ms"] for s in accepted]),
    }

    channels = sorted({ch for s in accepted for ch in s["ids"]})
    arrivals: list[float] = []
    delivery, lost, duplicates = {}, {}, {"messages": 0, "ids": 0, "examples": []}
    event_messages = 0
    for channel in channels:
        firsts, latencies, missing = [], [], []
        for s in accepted:
            nid = s["ids"].get(channel)
            if nid is None:
                continue
            times = received.get(nid)
            if not times:
                missing.append(nid)
                continue
            event_messages += len(times)
            firsts.append(min(times))
            latencies.append(min(times) - s["start_ms"])
            if len(times) > 1:
                duplicates["messages"] += len(times) - 1
                duplicates["ids"] += 1
                if len(duplicates["examples"]) < 20:
                    duplicates["examples"].append(nid)
        arrivals += firsts
        rows = statuses.get(channel, {})
        sent_rows = sum(rows.get(s, 0) for s in SENT)
        not_sent = sum(rows.values()) - sent_rows
        delivery[channel] = {
            "expected": sum(1 for s in accepted if channel in s["ids"]), "delivered": len(firsts),
            "per_s": _rate(firsts, origin),
            "accept_to_provider_ms": latency_summary(latencies),
            "first_delivery_seconds": _seconds(origin, min(firsts, default=None)),
            "last_delivery_seconds": _seconds(origin, max(firsts, default=None)),
        }
        lost[channel] = {"total": len(missing), "not_sent": not_sent,
                         "sent_not_seen_by_provider": max(0, len(missing) - not_sent), "examples": missing[:5]}
    last_delivery = max(arrivals, default=None)

    completed = []  # instant each event's last notification arrived, for events fully delivered
    for s in accepted:
        times = [received.get(nid) for nid in s["ids"].values()]
        if s["ids"] and all(times):
            completed.append(max(min(t) for t in times))
    delivered = {
        "notifications": len(arrivals),
        "notifications_per_s": _rate(arrivals, origin),
        "events": len(completed),
        "events_per_s": _rate(completed, origin),
        "first_accept_to_last_delivery_seconds": _seconds(first_accept, last_delivery),
        "last_accept_to_last_delivery_seconds": _seconds(last_accept, last_delivery),
        "undelivered_at_last_accept": (sum(d["expected"] for d in delivery.values())
                                       - sum(1 for t in arrivals if last_accept is not None and t <= last_accept)),
    }

    otp = _otp(otp_records, received, launch_ms, end_ms)
    otp_on_these = sum(len(received.get(r["id"]) or ()) for r in otp_records
                       if r.get("id") and r.get("channel") in PROVIDER)
    kinds = [k for k in platform_kinds if k in cpu]
    platform_seconds = round(sum(cpu.get(k, 0.0) for k in kinds), 2)
    events = len(accepted)
    notifications = len(arrivals)

    def per(seconds: float | None, count: int) -> float | None:
        return None if seconds is None or not count else round(seconds * 1e6 / count, 1)

    cpu_block = {
        "seconds_by_kind": cpu, "platform_seconds": platform_seconds,
        "platform_cpu_us_per_event": per(platform_seconds, events),
        "platform_cpu_us_per_notification": per(platform_seconds, notifications),
        "cpu_us_per_event_by_kind": {k: per(v, events) for k, v in cpu.items()},
        "emulator_cpu_us_per_event": per(cpu.get("emulator"), events),
        "client_cpu_seconds": client_cpu_seconds,
        "client_cpu_us_per_event": per(client_cpu_seconds, events),
        "events_counted": events, "notifications_counted": notifications,
    }
    window = (int(launch_ms), int(end_ms))
    return {
        "timed_out": timed_out,
        "accept": accept,
        "delivery": delivery,
        "delivered": delivered,
        "statuses": {ch: dict(sorted(rows.items())) for ch, rows in sorted(statuses.items())},
        "lost": {"total": sum(v["total"] for v in lost.values()), "by_channel": lost},
        "duplicates": duplicates,
        "other_messages": max(0, sum(by_provider.get(PROVIDER[c], 0) for c in channels) - event_messages
                              - otp_on_these),
        "otp": otp,
        "cpu": cpu_block,
        "memory": memory_summary(rss, launch_ms / 1000, end_ms / 1000),
        "timeline": {
            "start_s": round(int(launch_ms) // 1000 - launch_ms / 1000, 3),
            "accepted_per_s": _per_second(accept_times, *window),
            "delivered_per_s": {ch: _per_second([received[s["ids"][ch]][0] for s in accepted
                                                 if ch in s["ids"] and received.get(s["ids"][ch])], *window)
                                for ch in channels},
            "otp": [[round((r["accept_ms"] - launch_ms) / 1000, 2), round(min(received[r["id"]]) - r["accept_ms"], 1),
                     r["channel"]] for r in otp_records if r.get("id") and received.get(r["id"])],
        },
    }


def _otp(records: Sequence[dict], received: dict[str, list[int]], launch_ms: float, end_ms: float) -> dict:
    accepted = [r for r in records if r.get("id")]
    during = [r for r in accepted if launch_ms <= r["accept_ms"] <= end_ms]
    before = [r for r in accepted if r["accept_ms"] < launch_ms]
    latencies, missing_during = otp_latencies(during, received)
    _, missing = otp_latencies(accepted, received)
    refused = [r for r in records if not r.get("id")]
    return {
        "sent": len(records), "accepted": len(accepted), "refused": len(refused),
        "refused_examples": [r.get("error") or r.get("status") for r in refused[:3]],
        "delivered": len(accepted) - len(missing), "missing": len(missing), "missing_examples": missing[:5],
        "missing_during_blast": len(missing_during),
        "latency_ms": latency_summary(latencies),
        "latency_ms_before_launch": latency_summary(otp_latencies(before, received)[0]),
        "api_ms": latency_summary([r["api_ms"] for r in during if r.get("api_ms") is not None]),
    }


def event_sanity_problems(events: dict | None) -> list[str]:
    """What makes ``manage.py bench --scenario events`` exit 1: the run did not complete or timed
    out, an event was refused, a notification was lost, a rendered message differs from its
    templates, or an OTP was refused or never reached the provider. Duplicates are reported, not
    failed (at-least-once: a rare duplicate is acceptable, docs/ARCHITECTURE.md §1)."""
    if not events or not events.get("run"):
        return ["the event blast did not complete"]
    run = events["run"]
    problems = []
    if run["timed_out"]:
        problems.append("the event blast did not drain before the timeout")
    if run["accept"]["refused"]:
        problems.append(f"{run['accept']['refused']} event(s) refused by the API: {run['accept']['refused_examples']}")
    if run["lost"]["total"]:
        problems.append(f"lost {run['lost']['total']} notifications ({run['lost']['by_channel']})")
    bad = [c for c in events.get("content_checks", []) if not c["ok"]]
    if bad:
        problems.append(f"{len(bad)} message(s) not rendered as the templates say: {bad[:2]}")
    otp = run["otp"]
    if otp["refused"]:
        problems.append(f"{otp['refused']} OTP(s) refused by the API: {otp['refused_examples']}")
    if otp["missing"]:
        problems.append(f"{otp['missing']} OTP(s) never reached the provider: {otp['missing_examples']}")
    return problems


# --- text ---------------------------------------------------------------------------------------

WHOLE = "{:,.0f}"


def _num(value, fmt: str = "{:,.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def headline(events: dict) -> list[tuple[str, str]]:
    """``(figure, value)`` rows of the summary and the docs table."""
    run = events["run"]
    a, d, o, c = run["accept"], run["delivered"], run["otp"], run["cpu"]
    rows = [
        ("events accepted / sent / requested", f"{a['accepted']:,} / {a['sent']:,} / {a['requested']:,}"
         + (" (sending time-boxed)" if a.get("time_boxed") else "")),
        ("client connections", f"{events.get('concurrency', '?')} (aiohttp, closed loop)"),
        ("accept: wall time of the sends (s)", _num(a["seconds"])),
        ("accept: events/s mean (p50 of seconds)",
         f"{_num(a['events_per_s']['mean'])} ({_num(a['events_per_s']['p50'])})"),
        ("accept latency p50 / p99 (ms)", f"{_num(a['latency_ms']['p50'])} / {_num(a['latency_ms']['p99'])}"),
    ]
    for channel, block in run["delivery"].items():
        rows.append((f"{channel}: delivered/s mean (p50 of seconds)",
                     f"{_num(block['per_s']['mean'])} ({_num(block['per_s']['p50'])})"))
    for channel, block in run["delivery"].items():
        lat = block["accept_to_provider_ms"]
        rows.append((f"{channel}: event POST → provider p50 / p99 (s)",
                     f"{_num(_ms_to_s(lat['p50']), '{:,.2f}')} / {_num(_ms_to_s(lat['p99']), '{:,.2f}')}"))
    rows += [
        ("events delivered/s mean (every channel in)", _num(d["events_per_s"]["mean"])),
        ("notifications delivered/s mean", _num(d["notifications_per_s"]["mean"])),
        ("first accept → last delivery (s)", _num(d["first_accept_to_last_delivery_seconds"])),
        ("undelivered when the last event was accepted", f"{d['undelivered_at_last_accept']:,}"),
        ("OTP accept → provider p50 / p99 / max during the blast (ms)",
         f"{_num(o['latency_ms']['p50'])} / {_num(o['latency_ms']['p99'])} / {_num(o['latency_ms']['max'])}"),
        ("OTPs delivered / accepted", f"{o['delivered']:,} / {o['accepted']:,}"),
        ("platform CPU-µs per event (per notification)",
         f"{_num(c['platform_cpu_us_per_event'], WHOLE)} ({_num(c['platform_cpu_us_per_notification'], WHOLE)})"),
        ("emulator / bench client CPU-µs per event",
         f"{_num(c['emulator_cpu_us_per_event'], WHOLE)} / {_num(c['client_cpu_us_per_event'], WHOLE)}"),
        ("lost", f"{run['lost']['total']:,}"),
        ("duplicates (messages)", f"{run['duplicates']['messages']:,}"),
    ]
    return rows


def _ms_to_s(value: float | None) -> float | None:
    return None if value is None else value / 1000


def cpu_rows(events: dict, platform_kinds: Sequence[str]) -> list[tuple[str, str]]:
    """``(process kind, CPU-µs per event)``, the platform's kinds in ``platform_kinds`` order, then the
    emulator and the bench client."""
    per = events["run"]["cpu"]["cpu_us_per_event_by_kind"]
    rows = [(k, _num(per[k], WHOLE)) for k in platform_kinds if per.get(k) is not None]
    rows.append(("emulator (apart)", _num(per.get("emulator"), WHOLE)))
    rows.append(("bench client (apart)", _num(events["run"]["cpu"]["client_cpu_us_per_event"], WHOLE)))
    return rows


def summary_text(report: dict, platform_kinds: Sequence[str]) -> str:
    events = report.get("events")
    lines = []
    if events and events.get("run"):
        rows = headline(events)
        width = max(len(r[0]) for r in rows)
        lines += [f"{a:{width}}  {b}" for a, b in rows]
        lines.append("CPU-µs per event: " + ", ".join(f"{k} {v}" for k, v in cpu_rows(events, platform_kinds)))
    for problem in report.get("sanity", {}).get("problems", []):
        lines.append(f"SANITY: {problem}")
    return "\n".join(lines)


def docs_section(report: dict, json_name: str, png_name: str, platform_kinds: Sequence[str]) -> str:
    """The event blast's block of docs/PERFORMANCE.md for one report."""
    events = report["events"]
    git, machine = report.get("git", {}), report.get("machine", {})
    window = events.get("machine_window") or {}
    lines = [
        EVENTS_START,
        f"Run `{json_name}`: {report.get('started_at', '?')}, commit `{git.get('commit', '?')[:12]}`"
        f"{' (uncommitted changes)' if git.get('dirty') else ''}, {machine.get('cores', '?')} cores; during the "
        f"blast the machine was {window.get('busy_pct', '?')} % busy, the platform's processes "
        f"{window.get('platform_pct', '?')} % of it, host steal {window.get('steal_pct', '?')} %.",
        f"Command: `python manage.py bench {(report.get('options') or {}).get('argv', '')}`".rstrip() + ".",
        "", "| figure | value |", "|---|---:|",
    ]
    lines += [f"| {a} | {b} |" for a, b in headline(events)]
    lines += ["", "| process kind | CPU-µs per event |", "|---|---:|"]
    lines += [f"| {a} | {b} |" for a, b in cpu_rows(events, platform_kinds)]
    for problem in (report.get("sanity") or {}).get("problems", []):
        lines += ["", f"Sanity: {problem}"]
    lines += ["", f"![event blast: accepted and delivered per second, OTP latency]({png_name})", EVENTS_END]
    return "\n".join(lines)

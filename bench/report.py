"""The bench's figures, targets, sanity checks, summary table and the docs table: pure functions of
what a run collected (tested in ``tests/test_bench_report.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime

from bench.stats import (
    bucket_series,
    cpu_ms_per_notification,
    cpu_us_per_message,
    growth,
    latency_summary,
    otp_latencies,
    rate_summary,
    series_from_times,
    subtract_series,
)

MILLION = 1_000_000
ACTIVE = ("scheduled", "queued", "sending")
SENT = ("sent", "delivered")
WORKER_KINDS = ("worker_high", "worker_standard", "worker_fanout", "worker_naive", "worker_maintenance",
                "worker_receipts")
MB = 1024 * 1024


def _seconds_since(instant: datetime | None, launch_ms: float) -> float | None:
    return None if instant is None else round(instant.timestamp() - launch_ms / 1000, 2)


def summarize_run(*, launch_ms: float, end_ms: float, campaign: dict, statuses: dict[str, int], analysis: dict,
                  otp_records: Sequence[dict], channel: str, campaign_provider: str, bucket_ms: int,
                  cpu: dict[str, float],
                  rss: dict[str, list[tuple[float, int]]], platform_kinds: Iterable[str], timed_out: bool = False,
                  brownout_ms: float | None = None, otp_providers: dict[str, str] | None = None,
                  backup_account: str = "") -> dict:
    """Every figure of one blast run.

    ``channel``/``campaign_provider``: the campaign's; ``launch_ms``: client clock when the campaign
    was POSTed; ``end_ms``: when the bench saw it
    drained; ``campaign``: the Campaign row's ``started_at``, ``fanned_out_at``, ``member_count``,
    ``created_count``; ``statuses``: campaign notifications per status; ``analysis``: the emulator's
    analysis (``received_at_ms`` for the OTP ids) with buckets of ``bucket_ms``; ``otp_records``: the
    OTP sender's records; ``cpu``: CPU seconds per process kind over launch → end; ``rss``: RSS
    samples per kind over the same window.
    """
    received = analysis.get("received_at_ms") or {}
    accepted = [r for r in otp_records if r.get("id")]
    # Series: the campaign's provider minus the OTPs it carried = the standard tier.
    otp_first = {r["id"]: min(received[r["id"]]) for r in accepted if received.get(r["id"])}
    high_series = series_from_times(otp_first.values(), bucket_ms)
    same_channel = [otp_first[r["id"]] for r in accepted if r["id"] in otp_first
                    and r["channel"] == channel]
    provider_series = (analysis.get("per_bucket") or {}).get(campaign_provider, [])
    standard_series = subtract_series(provider_series, series_from_times(same_channel, bucket_ms))
    # A time-boxed (timed-out) run keeps sending while the bench collects: count only up to end_ms.
    standard_series = [b for b in standard_series if b[0] < end_ms]
    in_window = sum(count for _, count in standard_series)
    first_ms = standard_series[0][0] if standard_series else None
    last_ms = standard_series[-1][0] + bucket_ms if standard_series else None

    sent_rows = sum(statuses.get(s, 0) for s in SENT)
    not_sent = sum(statuses.get(s, 0) for s in ACTIVE)
    otp_seen = len(otp_first)
    campaign_seen = max(0, analysis.get("unique_notification_ids", 0) - otp_seen)
    unseen = max(0, sent_rows - campaign_seen)

    drain_s = round((last_ms - launch_ms) / 1000, 2) if last_ms else None
    per_second = bucket_series(_rebucket(standard_series, 1000), first_ms, last_ms - 1, 1000) if last_ms else []
    fanout = {
        "seconds": _seconds_since(campaign.get("fanned_out_at"), launch_ms),
        "scheduler_pickup_seconds": _seconds_since(campaign.get("started_at"), launch_ms),
        "members": campaign.get("member_count"),
        "created": campaign.get("created_count"),
    }
    if fanout["seconds"] is not None and fanout["scheduler_pickup_seconds"] is not None:
        fanout["shards_seconds"] = round(fanout["seconds"] - fanout["scheduler_pickup_seconds"], 2)

    during = [r for r in accepted if launch_ms <= r["accept_ms"] <= end_ms]
    before = [r for r in accepted if r["accept_ms"] < launch_ms]
    lat_during, missing_during = otp_latencies(during, received)
    lat_all, missing = otp_latencies(accepted, received)
    by_channel = {}
    for channel in sorted({r["channel"] for r in accepted}):
        lat, _ = otp_latencies([r for r in during if r["channel"] == channel], received)
        by_channel[channel] = latency_summary(lat)
    refused = [r for r in otp_records if not r.get("id")]
    otp = {
        "sent": len(otp_records), "accepted": len(accepted), "refused": len(refused),
        "refused_examples": [r.get("error") or r.get("status") for r in refused[:3]],
        "delivered": otp_seen, "missing": len(missing), "missing_examples": missing[:5],
        "latency_ms": latency_summary(lat_during),
        "latency_ms_before_launch": latency_summary(otp_latencies(before, received)[0]),
        "latency_ms_all": latency_summary(lat_all),
        "latency_ms_by_channel": by_channel,
        "api_ms": latency_summary([r["api_ms"] for r in during if r.get("api_ms") is not None]),
        "missing_during_blast": len(missing_during),
        # The API and the high worker carry only the OTPs (and the one campaign POST): their CPU over
        # the blast ÷ the OTPs accepted in it. Postgres and Redis are shared with the campaign here;
        # `manage.py bench_otp` measures them per OTP alone (bench/otp_cpu.py).
        "cpu_ms_per_notification": cpu_ms_per_notification(cpu, ("web", "worker_high"), len(during)),
    }

    delivered_total = sent_rows + otp_seen
    kinds = [k for k in platform_kinds if k in cpu]
    cpu_block = {
        "seconds_by_kind": cpu,
        "platform_seconds": round(sum(cpu.get(k, 0.0) for k in kinds), 2),
        "platform_cpu_us_per_notification": cpu_us_per_message(cpu, kinds, delivered_total),
        "emulator_cpu_us_per_notification": cpu_us_per_message(cpu, ["emulator"], delivered_total),
        "notifications_counted": delivered_total,
    }
    memory = memory_summary(rss, launch_ms / 1000, end_ms / 1000)

    result = {
        "timed_out": timed_out,
        "fanout": fanout,
        "drain": {"seconds": drain_s, "delivered": sent_rows,
                  "received_in_window": in_window,
                  "deliveries_per_s": rate_summary(in_window, drain_s, per_second),
                  "first_delivery_seconds": round((first_ms - launch_ms) / 1000, 2) if first_ms else None},
        "statuses": dict(sorted(statuses.items())),
        "otp": otp,
        "lost": {"total": not_sent + unseen, "not_sent": not_sent, "sent_not_seen_by_provider": unseen,
                 "failed": statuses.get("failed", 0)},
        "duplicates": analysis.get("duplicates") or {"messages": 0, "ids": 0, "examples": []},
        "emulator": {"total": analysis.get("total"), "by_provider": analysis.get("by_provider"),
                     "by_account": analysis.get("by_account")},
        "cpu": cpu_block,
        "memory": memory,
        "timeline": {
            "standard_per_s": bucket_series(_rebucket(standard_series, 1000), int(launch_ms), int(end_ms), 1000),
            "high_per_s": bucket_series(_rebucket(high_series, 1000), int(launch_ms), int(end_ms), 1000),
            "start_s": round(int(launch_ms) // 1000 * 1000 / 1000 - launch_ms / 1000, 3),
            "otp": [[round((r["accept_ms"] - launch_ms) / 1000, 2), round(otp_first[r["id"]] - r["accept_ms"], 1),
                     r["channel"]] for r in accepted if r["id"] in otp_first],
            "brownout_s": round((brownout_ms - launch_ms) / 1000, 2) if brownout_ms else None,
        },
    }
    if brownout_ms:
        result["brownout"] = brownout_summary(brownout_ms, accepted, received, otp_providers or {},
                                              (analysis.get("by_account") or {}).get(backup_account, 0))
    return result


def _rebucket(series: Sequence[Sequence[int]], bucket_ms: int) -> list[list[int]]:
    return series_from_times_weighted((start // bucket_ms * bucket_ms, count) for start, count in series)


def series_from_times_weighted(pairs: Iterable[tuple[int, int]]) -> list[list[int]]:
    out: dict[int, int] = {}
    for start, count in pairs:
        out[start] = out.get(start, 0) + count
    return [[s, out[s]] for s in sorted(out)]


def memory_summary(rss: dict[str, list[tuple[float, int]]], t0: float, t1: float) -> dict:
    """Peak RSS (MB) per kind, and for workers the change from a quarter into the run to its end
    (the first quarter is warm-up: imports, connection pools)."""
    peak = {kind: round(max(v for _, v in series) / MB, 1) for kind, series in rss.items() if series}
    workers = {}
    settle = t0 + (t1 - t0) / 4
    for kind, series in rss.items():
        if kind not in WORKER_KINDS:
            continue
        later = [v for t, v in series if t >= settle]
        if len(later) >= 2:
            workers[kind] = {"settled_mb": round(later[0] / MB, 1), "end_mb": round(later[-1] / MB, 1),
                             "growth": growth(later[0], later[-1])}
    return {"peak_rss_mb": peak, "workers": workers}


def brownout_summary(brownout_ms: float, accepted: Sequence[dict], received: dict[str, list[int]],
                     providers: dict[str, str], backup_messages: int) -> dict:
    """After the primary SMS provider slowed down: how fast high-tier SMS moved to the backup, and
    the OTP latency per channel (email and push should not notice)."""
    after = [r for r in accepted if r["accept_ms"] >= brownout_ms]
    sms_after = [r for r in after if r["channel"] == "sms"]
    via_backup = [r for r in sms_after if providers.get(r["id"]) == "twilio_backup"]
    first_backup = min((min(received[r["id"]]) for r in via_backup if received.get(r["id"])), default=None)
    by_channel = {}
    for channel in sorted({r["channel"] for r in after}):
        lat, missing = otp_latencies([r for r in after if r["channel"] == channel], received)
        by_channel[channel] = {**latency_summary(lat), "missing": len(missing)}
    return {
        "at_ms": round(brownout_ms),
        "sms_otps_after": len(sms_after),
        "sms_otps_via_backup": len(via_backup),
        "failover_seconds": round((first_backup - brownout_ms) / 1000, 2) if first_backup else None,
        "backup_account_messages": backup_messages,
        "latency_ms_after_by_channel": by_channel,
    }


# --- targets and sanity ------------------------------------------------------------------------

def target(name: str, value: float | None, op: str, limit: float, unit: str, note: str = "") -> dict:
    """One target: ``met`` and, when missed, ``shortfall`` = how far off relative to the target."""
    if value is None:
        return {"name": name, "target": f"{op} {limit:g} {unit}".strip(), "value": None, "unit": unit, "met": None,
                "shortfall": "not measured", "note": note}
    met = value < limit if op == "<" else value <= limit if op == "≤" else value >= limit
    shortfall = None
    if not met:
        off = (value - limit) / limit if op in ("<", "≤") else (limit - value) / limit
        shortfall = f"{'over' if op in ('<', '≤') else 'under'} by {off:.0%} ({_fmt(value)} vs {op} {_fmt(limit)})"
    return {"name": name, "target": f"{op} {_fmt(limit)} {unit}".strip(), "value": value, "unit": unit, "met": met,
            "shortfall": shortfall, "note": note}


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}".rstrip("0").rstrip(".")


#: The reference points of a run (bench/ceilings.py, bench/naive.py), in the order the report lists them.
CEILINGS = ("durable_ceiling", "sdk_ceiling", "raw_ceiling", "raw_http_transport")
CEILING_TITLES = {
    "durable_ceiling": "durable ceiling: insert, send_batch, mark sent, batched, no Celery/API",
    "sdk_ceiling": "SDK ceiling: send_batch in a loop, no database",
    "raw_ceiling": "raw ceiling: send_batch in a loop, no database (email: JSON building)",
    "raw_http_transport": "pooled aiohttp, no SDK (informative)",
    "naive": "naive baseline at its best (p50 rate)",
}


def compared_with(channel: str) -> str:
    """The ceiling the platform is held to: the durable one for email (its SDK call costs ~8 µs, so
    the raw loop measures JSON building), the SDK one for SMS and push (the SDK call dominates)."""
    return "durable_ceiling" if channel == "email" else "sdk_ceiling"


def reference_points(tiered: dict | None, naive: dict | None, ceilings: dict[str, dict | None], channel: str) -> dict:
    """The platform's sustained rates divided by each reference point of the same run.

    ``ceilings``: the JSON blocks of :data:`CEILINGS` (missing or ``None``: not measured). Returns
    ``{"compared_with", "platform_p50_per_s", "platform_mean_per_s", "points": {name: {"msgs_per_s",
    "p50_ratio", "mean_ratio"}}}``; ratios are ``None`` when either side is missing.
    """
    drain = ((tiered or {}).get("run") or {}).get("drain", {}).get("deliveries_per_s", {})
    p50, mean = drain.get("p50"), drain.get("mean")
    rates = {name: (ceilings.get(name) or {}).get("msgs_per_s") for name in CEILINGS if ceilings.get(name)}
    naive_p50 = (((naive or {}).get("run") or {}).get("drain", {}).get("deliveries_per_s", {}) or {}).get("p50")
    if naive_p50:
        rates["naive"] = naive_p50

    def ratio(value, rate):
        return round(value / rate, 3) if value and rate else None

    return {"compared_with": compared_with(channel), "platform_p50_per_s": p50, "platform_mean_per_s": mean,
            "points": {name: {"msgs_per_s": rate, "p50_ratio": ratio(p50, rate), "mean_ratio": ratio(mean, rate)}
                       for name, rate in rates.items()}}


#: The issue's targets per channel: 1M drained (POST → last message at the provider) in seconds, and
#: platform CPU-µs per notification.
DRAIN_TARGET_SECONDS = {"email": 200, "push": 400, "sms": 400}
CPU_TARGET_US = {"email": 200, "push": 500, "sms": 500}


def evaluate_targets(tiered: dict, naive: dict | None, reference: dict | None, recipients: int,
                     channel: str) -> list[dict]:
    """The issue's targets for one run; ``reference``: :func:`reference_points` (``None``: none measured)."""
    run = tiered["run"]
    projected = recipients != MILLION
    note = f"projected from {recipients:,} recipients" if projected else ""
    p50 = run["drain"]["deliveries_per_s"]["p50"]
    mean = run["drain"]["deliveries_per_s"]["mean"]
    targets = [target("OTP accept→provider p99 during the blast", run["otp"]["latency_ms"]["p99"], "<", 1000, "ms")]
    drain_1m = (run["drain"]["seconds"] if not projected else round(MILLION / mean, 1) if mean else None)
    targets.append(target(f"1M {channel} drained", drain_1m, "≤", DRAIN_TARGET_SECONDS[channel], "s",
                          f"{note}: 1,000,000 / mean rate" if projected else ""))
    targets.append(target(f"platform CPU-µs per notification ({channel})",
                          (run.get("cpu") or {}).get("platform_cpu_us_per_notification"), "≤",
                          CPU_TARGET_US[channel], "µs"))
    fan = run["fanout"]["seconds"]
    fan_1m = fan if not projected or fan is None else round(fan * MILLION / recipients, 1)
    targets.append(target("fan-out of 1M", fan_1m, "≤", 60, "s", f"{note}, linear" if projected else ""))
    ceiling = compared_with(channel)
    point = ((reference or {}).get("points") or {}).get(ceiling) or {}
    targets.append(target(f"platform ÷ {ceiling.replace('_', ' ')} (p50 rate / ceiling msgs/s)",
                          point.get("p50_ratio"), "≥", 0.7, "×"))
    naive_p50 = naive["run"]["drain"]["deliveries_per_s"]["p50"] if naive else None
    if channel == "email":
        targets.append(target("tiered vs naive (p50 rates)", round(p50 / naive_p50, 1) if p50 and naive_p50 else None,
                              "≥", 10, "×"))
    growths = [w["growth"] for w in run["memory"]["workers"].values() if w.get("growth") is not None]
    targets.append(target("worker memory growth after warm-up (largest worker)", max(growths) if growths else None,
                          "≤", 0.1, "", "RSS a quarter into the run → end"))
    return targets


def sanity_problems(tiered: dict | None) -> list[str]:
    """What makes ``manage.py bench`` exit 1: anything lost, or an OTP of the tiered run not delivered."""
    if tiered is None:
        return ["the tiered run did not complete"]
    run = tiered["run"]
    problems = []
    if run["timed_out"]:
        problems.append("the campaign did not drain before the timeout")
    if run["lost"]["total"]:
        problems.append(f"lost {run['lost']['total']} notifications ({run['lost']})")
    otp = run["otp"]
    if otp["refused"]:
        problems.append(f"{otp['refused']} OTP(s) refused by the API: {otp['refused_examples']}")
    if otp["missing"]:
        problems.append(f"{otp['missing']} OTP(s) never reached the provider: {otp['missing_examples']}")
    if not otp["accepted"] and otp["sent"]:
        problems.append("no OTP accepted")
    return problems


# --- text ---------------------------------------------------------------------------------------

def headline(report: dict) -> list[tuple[str, str, str]]:
    """``(figure, tiered, naive)`` rows of the summary table."""
    def get(run: dict | None, *path, fmt="{:,.1f}"):
        node = run
        for key in path:
            if not isinstance(node, dict) or node.get(key) is None:
                return "–"
            node = node[key]
        return fmt.format(node) if isinstance(node, (int, float)) else str(node)

    t = (report.get("tiered") or {}).get("run")
    n = (report.get("naive") or {}).get("run")
    return [
        ("recipients", get(report.get("tiered"), "recipients", fmt="{:,}"),
         get(report.get("naive"), "recipients", fmt="{:,}")),
        ("fan-out (s)", get(t, "fanout", "seconds"), get(n, "fanout", "seconds")),
        ("drain (s)", get(t, "drain", "seconds"), get(n, "drain", "seconds")),
        ("deliveries/s mean", get(t, "drain", "deliveries_per_s", "mean"), get(n, "drain", "deliveries_per_s", "mean")),
        ("deliveries/s p50", get(t, "drain", "deliveries_per_s", "p50"), get(n, "drain", "deliveries_per_s", "p50")),
        ("OTP p50 (ms)", get(t, "otp", "latency_ms", "p50"), get(n, "otp", "latency_ms", "p50")),
        ("OTP p95 (ms)", get(t, "otp", "latency_ms", "p95"), get(n, "otp", "latency_ms", "p95")),
        ("OTP p99 (ms)", get(t, "otp", "latency_ms", "p99"), get(n, "otp", "latency_ms", "p99")),
        ("OTP max (ms)", get(t, "otp", "latency_ms", "max"), get(n, "otp", "latency_ms", "max")),
        ("OTPs delivered / accepted", _ratio(t, "otp"), _ratio(n, "otp")),
        ("OTP CPU-ms: API + high worker", get(t, "otp", "cpu_ms_per_notification", "total", fmt="{:,.2f}"),
         get(n, "otp", "cpu_ms_per_notification", "total", fmt="{:,.2f}")),
        ("platform CPU-µs / notification", get(t, "cpu", "platform_cpu_us_per_notification"),
         get(n, "cpu", "platform_cpu_us_per_notification")),
        ("emulator CPU-µs / notification", get(t, "cpu", "emulator_cpu_us_per_notification"),
         get(n, "cpu", "emulator_cpu_us_per_notification")),
        ("lost", _lost(t), _lost(n)),
        ("duplicates (messages)", get(t, "duplicates", "messages", fmt="{:,}"),
         get(n, "duplicates", "messages", fmt="{:,}")),
        ("peak RSS worker_standard / naive (MB)", get(t, "memory", "peak_rss_mb", "worker_standard"),
         get(n, "memory", "peak_rss_mb", "worker_naive")),
    ]


def _lost(run: dict | None) -> str:
    if not run:
        return "–"
    if run.get("timed_out"):
        return f"{run['lost']['not_sent']:,} unsent (time-boxed)"
    return f"{run['lost']['total']:,}"


def _ratio(run: dict | None, key: str) -> str:
    if not run:
        return "–"
    return f"{run[key]['delivered']:,} / {run[key]['accepted']:,}"


def _costs(raw: dict) -> str:
    """``client X CPU-µs/msg, emulator Y CPU-µs/msg[, database Z]`` of a ceiling measurement."""
    text = f"client {raw['client_cpu_us_per_msg']} CPU-µs/msg, emulator {raw['emulator_cpu_us_per_msg']} CPU-µs/msg"
    if raw.get("mode") == "durable" and raw.get("database_cpu_us_per_msg") is not None:
        text += f", Postgres + Redis {raw['database_cpu_us_per_msg']} CPU-µs/msg"
    return text


def reference_rows(report: dict) -> list[tuple[str, str, str, str, str]]:
    """``(reference point, msgs/s, its CPU costs, platform p50 ÷ it, platform mean ÷ it)`` rows."""
    points = (report.get("reference") or {}).get("points") or {}
    held_to = (report.get("reference") or {}).get("compared_with")
    rows = []
    for name in (*CEILINGS, "naive"):
        if name not in points:
            continue
        block = report.get(name) if name != "naive" else None
        how = ""
        if block:
            how = (f"{block['processes']} processes, batch {block['batch_size']}, concurrency {block['concurrency']}; "
                   + _costs(block))
        elif name == "naive":
            naive = report.get("naive") or {}
            how = (f"{naive.get('pool', '?')} × {naive.get('concurrency', '?')}; "
                   f"platform CPU {((naive.get('run') or {}).get('cpu') or {}).get('platform_cpu_us_per_notification')}"
                   " µs/notification")
        point = points[name]
        title = CEILING_TITLES.get(name, name) + (" **(the target's)**" if name == held_to else "")
        rows.append((title, "not measured" if point["msgs_per_s"] is None else f"{point['msgs_per_s']:,}", how,
                     "–" if point["p50_ratio"] is None else f"{point['p50_ratio']:,}",
                     "–" if point["mean_ratio"] is None else f"{point['mean_ratio']:,}"))
    return rows


def summary_text(report: dict) -> str:
    rows = headline(report)
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'tiered':>14}  {'naive':>14}"]
    lines += [f"{a:{width}}  {b:>14}  {c:>14}" for a, b, c in rows]
    for title, rate, how, p50_ratio, mean_ratio in reference_rows(report):
        lines.append(f"{title.replace('**', '')}: {rate} msgs/s ({how}); platform ÷ it: p50 {p50_ratio}, "
                     f"mean {mean_ratio}")
    for t in report.get("targets", []):
        mark = "ok " if t["met"] else "-- " if t["met"] is None else "MISS"
        value = "–" if t["value"] is None else _fmt(t["value"])
        extra = f"  {t['shortfall']}" if t["shortfall"] and t["met"] is False else ""
        lines.append(f"[{mark}] {t['name']}: {value} {t['unit']} (target {t['target']}){extra}"
                     + (f"  ({t['note']})" if t.get("note") else ""))
    b = (report.get("tiered") or {}).get("run", {}).get("brownout")
    if b:
        lines.append(f"brownout: SMS OTPs after {b['sms_otps_after']}, via backup {b['sms_otps_via_backup']}, "
                     f"failover after {b['failover_seconds']} s; latency after by channel: "
                     + ", ".join(f"{c} p99 {v['p99']} ms" for c, v in b["latency_ms_after_by_channel"].items()))
    for problem in report.get("sanity", {}).get("problems", []):
        lines.append(f"SANITY: {problem}")
    return "\n".join(lines)


DOCS_START = "<!-- bench:results:start -->"
DOCS_END = "<!-- bench:results:end -->"


def docs_section(report: dict, json_name: str, png_name: str) -> str:
    """The results block of docs/PERFORMANCE.md for one report."""
    machine = report.get("machine", {})
    git = report.get("git", {})
    opts = report.get("options", {})
    steal = ((report.get("tiered") or {}).get("machine_window") or {}).get("steal_pct", "?")
    lines = [
        DOCS_START,
        f"Run `{json_name}`: {report.get('started_at', '?')}, commit `{git.get('commit', '?')[:12]}`"
        f"{' (uncommitted changes)' if git.get('dirty') else ''}, {machine.get('cores', '?')} cores, "
        f"host steal during the tiered blast {steal} %.",
        f"Command: `python manage.py bench {opts.get('argv', '')}`".rstrip() + ".",
        "",
        "| figure | tiered | naive |",
        "|---|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in headline(report)]
    refs = reference_rows(report)
    if refs:
        lines += ["", "Reference points measured in the same run (docs/PERFORMANCE.md, *Reference points*):", "",
                  "| reference point | msgs/s | how, CPU per message | platform p50 ÷ it | platform mean ÷ it |",
                  "|---|---:|---|---:|---:|"]
        lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in refs]
    lines += ["", "| target | value | met | by how much |", "|---|---:|:-:|---|"]
    for t in report.get("targets", []):
        value = "–" if t["value"] is None else f"{_fmt(t['value'])} {t['unit']}".strip()
        met = "yes" if t["met"] else "–" if t["met"] is None else "**no**"
        detail = (t["shortfall"] or "") if t["met"] is False else ""
        if t.get("note"):
            detail = f"{detail} ({t['note']})".strip()
        lines.append(f"| {t['name']} (target {t['target']}) | {value} | {met} | {detail} |")
    for note in report.get("notes", []):
        lines += ["", f"Note: {note}"]
    lines += ["", f"![deliveries/s per tier and OTP latency]({png_name})", DOCS_END]
    return "\n".join(lines)


def channel_of(report: dict) -> str:
    """The campaign channel of a report (its `--channel`)."""
    return (report.get("options") or {}).get("channel") or "email"


def _target_cell(t: dict | None) -> str:
    if t is None:
        return "–"
    value = "–" if t["value"] is None else f"{_fmt(t['value'])} {t['unit']}".strip()
    if t["met"] is False:
        return f"**{value}** ({t['shortfall']})"
    return value + (" ✓" if t["met"] else "")


def docs_section_runs(runs: list[tuple[dict, str, str]]) -> str:
    """The results block of docs/PERFORMANCE.md for several runs side by side (one per channel):
    ``runs`` = ``[(report, json name, png name)]``. One run: :func:`docs_section`."""
    if len(runs) == 1:
        return docs_section(*runs[0])
    channels = [channel_of(r) for r, _j, _p in runs]
    lines = [DOCS_START, "Runs (one per channel, each its own `make bench` on this 2-core machine):", ""]
    for (r, json_name, _png), channel in zip(runs, channels, strict=True):
        git = r.get("git", {})
        steal = ((r.get("tiered") or {}).get("machine_window") or {}).get("steal_pct", "?")
        commit = git.get("commit", "?")[:12]
        lines.append(f"- **{channel}**: `{json_name}`, {r.get('started_at', '?')}, commit `{commit}`"
                     f"{' (uncommitted changes)' if git.get('dirty') else ''}, host steal {steal} %, command "
                     f"`python manage.py bench {(r.get('options') or {}).get('argv', '')}`".rstrip() + ".")
    lines += ["", "| figure (tiered platform) | " + " | ".join(channels) + " |", "|---|" + "---:|" * len(runs)]
    heads = [headline(r) for r, _j, _p in runs]
    for i, (figure, _t, _n) in enumerate(heads[0]):
        lines.append(f"| {figure} | " + " | ".join(h[i][1] for h in heads) + " |")
    lines.append("| naive baseline: deliveries/s p50 (recipients) | " + " | ".join(
        f"{h[4][2]} ({h[0][2]})" for h in heads) + " |")
    lines += ["", "Reference points measured in the same run (msgs/s; platform p50 ÷ it):", "",
              "| reference point | " + " | ".join(channels) + " |", "|---|" + "---:|" * len(runs)]
    for name in (*CEILINGS, "naive"):
        cells = []
        for r, _j, _p in runs:
            point = ((r.get("reference") or {}).get("points") or {}).get(name)
            held = (r.get("reference") or {}).get("compared_with") == name
            if not point or point["msgs_per_s"] is None:
                cells.append("–")
                continue
            block = r.get(name) if name != "naive" else None
            cost = f", client {block['client_cpu_us_per_msg']} CPU-µs/msg" if block else ""
            cells.append(f"{point['msgs_per_s']:,.0f}{cost}; ÷ **{point['p50_ratio']}**"
                         + (" (target's)" if held else ""))
        if any(c != "–" for c in cells):
            lines.append(f"| {CEILING_TITLES.get(name, name)} | " + " | ".join(cells) + " |")
    names: list[str] = []
    by_run = []
    for r, _j, _p in runs:
        found = {}
        for t in r.get("targets", []):
            key = t["name"].replace(f"({channel_of(r)})", "").replace(f"1M {channel_of(r)} ", "1M ").strip()
            found[key] = t
            if key not in names:
                names.append(key)
        by_run.append(found)
    lines += ["", "| target | " + " | ".join(channels) + " |", "|---|" + "---|" * len(runs)]
    for key in names:
        targets = [found.get(key) for found in by_run]
        limits = sorted({t["target"] for t in targets if t})
        lines.append(f"| {key} (target {' / '.join(limits)}) | " + " | ".join(_target_cell(t) for t in targets) + " |")
    for (r, _j, _p), channel in zip(runs, channels, strict=True):
        for note in r.get("notes", []):
            lines += ["", f"Note ({channel}): {note}"]
    lines.append("")
    lines += [f"![{channel}: deliveries/s per tier and OTP latency]({png})"
              for (_r, _j, png), channel in zip(runs, channels, strict=True)]
    lines.append(DOCS_END)
    return "\n".join(lines)


def replace_docs_section(text: str, section: str, start: str = DOCS_START, end: str = DOCS_END) -> str:
    """``text`` with its block between the markers ``start`` and ``end`` (default: the results
    block) replaced by ``section`` (appended when there is none)."""
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _m: section, text)
    return text.rstrip("\n") + "\n\n" + section + "\n"

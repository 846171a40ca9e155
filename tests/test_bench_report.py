"""bench.report: figures, targets, sanity and the docs block, from synthetic inputs."""

from datetime import UTC, datetime

from bench import report

LAUNCH = 1_700_000_000_000.0  # ms; a whole second
MB = 1024 * 1024


def _run(**overrides):
    """A campaign of 10 emails on sendgrid and 3 email OTPs (one before launch, one never received)."""
    analysis = {
        "total": 12, "by_provider": {"sendgrid": 12, "twilio": 0, "fcm": 0, "smtp": 0}, "by_account": {"": 12},
        "unique_notification_ids": 12, "duplicates": {"messages": 0, "ids": 0, "examples": []},
        # 10 campaign messages: 4 in second 1, 6 in second 2; OTPs at +1.05 s and -0.5 s (buckets of 100 ms)
        "per_bucket": {"sendgrid": [[int(LAUNCH) - 500, 1], [int(LAUNCH) + 1000, 5], [int(LAUNCH) + 2000, 6]]},
        "received_at_ms": {"o1": [int(LAUNCH) + 1050], "o0": [int(LAUNCH) - 450]},
        "first_ms": int(LAUNCH) - 450, "last_ms": int(LAUNCH) + 2050,
    }
    records = [
        {"id": "o0", "channel": "email", "accept_ms": LAUNCH - 500, "api_ms": 5.0},
        {"id": "o1", "channel": "email", "accept_ms": LAUNCH + 1000, "api_ms": 7.0},
        {"id": "o2", "channel": "email", "accept_ms": LAUNCH + 1500, "api_ms": 9.0},
    ]
    kwargs = dict(
        launch_ms=LAUNCH, end_ms=LAUNCH + 3000,
        campaign={"started_at": datetime.fromtimestamp((LAUNCH + 500) / 1000, UTC),
                  "fanned_out_at": datetime.fromtimestamp((LAUNCH + 1250) / 1000, UTC),
                  "member_count": 10, "created_count": 10},
        statuses={"sent": 10}, analysis=analysis, otp_records=records, channel="email",
        campaign_provider="sendgrid", bucket_ms=100,
        cpu={"web": 0.1, "worker_high": 0.2, "worker_standard": 0.3, "postgres": 0.4, "redis": 0.0, "beat": 0.0,
             "worker_maintenance": 0.0, "emulator": 0.05},
        rss={"worker_standard": [(LAUNCH / 1000 + t, (100 + t) * MB) for t in range(4)],
             "web": [(LAUNCH / 1000, 50 * MB)]},
        platform_kinds=("web", "worker_high", "worker_standard", "worker_maintenance", "beat", "postgres", "redis"),
    )
    kwargs.update(overrides)
    return report.summarize_run(**kwargs)


def test_summarize_run_figures():
    run = _run()
    assert run["fanout"] == {"seconds": 1.25, "scheduler_pickup_seconds": 0.5, "members": 10, "created": 10,
                             "shards_seconds": 0.75}
    # Standard tier = sendgrid minus the email OTPs it carried: 4 in [1.0, 1.1) s and 6 in [2.0, 2.1) s.
    assert run["drain"] == {"seconds": 2.1, "delivered": 10, "received_in_window": 10,
                            "deliveries_per_s": {"mean": 4.8, "p50": 5.0, "peak": 6},
                            "first_delivery_seconds": 1.0}
    assert run["timeline"]["standard_per_s"] == [0, 4, 6, 0]
    assert run["timeline"]["high_per_s"] == [0, 1, 0, 0]
    otp = run["otp"]
    assert (otp["sent"], otp["accepted"], otp["delivered"], otp["missing"]) == (3, 3, 2, 1)
    assert otp["missing_examples"] == ["o2"]
    assert otp["latency_ms"]["count"] == 1 and otp["latency_ms"]["p99"] == 50.0  # only OTPs during the blast
    assert otp["latency_ms_before_launch"]["p50"] == 50.0
    assert otp["missing_during_blast"] == 1
    # CPU-ms per OTP accepted during the blast (o1, o2) of the kinds only OTPs use: web 0.1 s, high 0.2 s.
    assert otp["cpu_ms_per_notification"] == {"total": 150.0, "web": 50.0, "worker_high": 100.0}
    assert run["lost"] == {"total": 0, "not_sent": 0, "sent_not_seen_by_provider": 0, "failed": 0}
    # Platform = everything but the emulator: 1.0 CPU-s over 10 campaign + 2 OTP deliveries.
    assert run["cpu"]["platform_seconds"] == 1.0
    assert run["cpu"]["platform_cpu_us_per_notification"] == 83333.3
    assert run["cpu"]["emulator_cpu_us_per_notification"] == 4166.7
    assert run["memory"]["peak_rss_mb"] == {"worker_standard": 103.0, "web": 50.0}
    # Settled a quarter in (t ≥ 0.75 s: the sample at 1 s) → end (3 s): 101 → 103 MB.
    assert run["memory"]["workers"] == {"worker_standard": {"settled_mb": 101.0, "end_mb": 103.0, "growth": 0.02}}


def test_a_time_boxed_run_counts_only_what_arrived_before_its_end():
    run = _run(end_ms=LAUNCH + 1500, timed_out=True)
    assert run["drain"]["seconds"] == 1.1 and run["drain"]["received_in_window"] == 4
    assert run["drain"]["deliveries_per_s"]["mean"] == 3.6
    assert report._lost(run) == "0 unsent (time-boxed)"


def test_lost_counts_rows_never_sent_and_sends_the_provider_never_saw():
    run = _run(statuses={"sent": 8, "queued": 1, "sending": 1, "failed": 0}, analysis=_analysis_with_unique(9))
    # 8 sent rows, 9 unique ids seen of which 2 are OTPs → 7 campaign ids seen: 1 unseen; 2 not sent.
    assert run["lost"] == {"total": 3, "not_sent": 2, "sent_not_seen_by_provider": 1, "failed": 0}


def _analysis_with_unique(unique):
    return {"total": unique, "by_provider": {}, "by_account": {}, "unique_notification_ids": unique,
            "duplicates": {"messages": 0, "ids": 0, "examples": []}, "per_bucket": {},
            "received_at_ms": {"o1": [int(LAUNCH) + 1050], "o0": [int(LAUNCH) - 450]}}


def test_brownout_summary():
    accepted = [
        {"id": "s1", "channel": "sms", "accept_ms": 900.0},
        {"id": "s2", "channel": "sms", "accept_ms": 1100.0},
        {"id": "s3", "channel": "sms", "accept_ms": 1200.0},
        {"id": "e1", "channel": "email", "accept_ms": 1300.0},
    ]
    received = {"s1": [950], "s2": [4100], "s3": [1500], "e1": [1350]}
    providers = {"s1": "twilio", "s2": "twilio", "s3": "twilio_backup", "e1": "sendgrid"}
    result = report.brownout_summary(1000.0, accepted, received, providers, backup_messages=1)
    assert result["sms_otps_after"] == 2
    assert result["sms_otps_via_backup"] == 1
    assert result["failover_seconds"] == 0.5
    assert result["backup_account_messages"] == 1
    assert result["latency_ms_after_by_channel"]["sms"]["max"] == 3000.0
    assert result["latency_ms_after_by_channel"]["email"]["p99"] == 50.0


def test_target_says_by_how_much_it_was_missed():
    assert report.target("p99", 1450.0, "<", 1000, "ms") == {
        "name": "p99", "target": "< 1,000 ms", "value": 1450.0, "unit": "ms", "met": False,
        "shortfall": "over by 45% (1,450 vs < 1,000)", "note": ""}
    assert report.target("ratio", 0.5, "≥", 0.7, "×")["shortfall"] == "under by 29% (0.5 vs ≥ 0.7)"
    assert report.target("ratio", 0.7, "≥", 0.7, "×")["met"] is True
    assert report.target("drain", 200.0, "≤", 200, "s")["met"] is True
    assert report.target("x", None, "<", 1, "ms")["met"] is None


def _tiered(p50=5000.0, mean=4000.0, fan=3.0, p99=500.0, growths=(0.01,)):
    return {"run": {"drain": {"seconds": 12.5, "deliveries_per_s": {"p50": p50, "mean": mean}},
                    "fanout": {"seconds": fan}, "otp": {"latency_ms": {"p99": p99}},
                    "memory": {"workers": {f"w{i}": {"growth": g} for i, g in enumerate(growths)}}}}


def test_evaluate_targets_projects_a_smaller_run_to_1m():
    naive = {"run": {"drain": {"deliveries_per_s": {"p50": 250.0}}}}
    reference = report.reference_points(_tiered(), naive, {"raw_ceiling": {"msgs_per_s": 50_000.0},
                                                           "durable_ceiling": {"msgs_per_s": 10_000.0}}, "email")
    targets = report.evaluate_targets(_tiered(), naive, reference, 50_000, "email")
    by_name = {t["name"]: t for t in targets}
    assert by_name["1M email drained"]["value"] == 250.0 and by_name["1M email drained"]["met"] is False
    assert by_name["fan-out of 1M"]["value"] == 60.0 and by_name["fan-out of 1M"]["met"] is True
    assert by_name["platform ÷ durable ceiling (p50 rate / ceiling msgs/s)"]["value"] == 0.5
    assert by_name["tiered vs naive (p50 rates)"]["value"] == 20.0
    assert by_name["OTP accept→provider p99 during the blast"]["met"] is True
    assert by_name["worker memory growth after warm-up (largest worker)"]["value"] == 0.01


def test_evaluate_targets_without_reference_points():
    targets = report.evaluate_targets(_tiered(), None, None, 1_000_000, "sms")
    names = [t["name"] for t in targets]
    assert "1M email drained" not in names and "tiered vs naive (p50 rates)" not in names
    by_name = {t["name"]: t for t in targets}
    # An SMS (or push) run is held to 400 s for 1M and 500 CPU-µs per notification.
    assert (by_name["1M sms drained"]["value"], by_name["1M sms drained"]["target"]) == (12.5, "≤ 400 s")
    assert by_name["platform CPU-µs per notification (sms)"]["met"] is None  # not measured in this run
    assert next(t for t in targets if t["name"].startswith("platform ÷ sdk ceiling"))["met"] is None


def test_cpu_targets_are_per_channel():
    run = _tiered()
    run["run"]["cpu"] = {"platform_cpu_us_per_notification": 350.0}
    by_channel = {c: next(t for t in report.evaluate_targets(run, None, None, 1_000_000, c)
                          if t["name"].startswith("platform CPU-µs")) for c in ("email", "push", "sms")}
    assert [(t["target"], t["met"]) for t in by_channel.values()] == [("≤ 200 µs", False), ("≤ 500 µs", True),
                                                                      ("≤ 500 µs", True)]
    assert by_channel["email"]["shortfall"] == "over by 75% (350 vs ≤ 200)"


def test_reference_points_divide_the_platform_rates_by_each_ceiling_of_the_run():
    ceilings = {"sdk_ceiling": {"msgs_per_s": 2000.0}, "durable_ceiling": {"msgs_per_s": 8000.0},
                "raw_http_transport": {"msgs_per_s": 4000.0}, "raw_ceiling": None}
    ref = report.reference_points(_tiered(p50=1600.0, mean=1000.0), {"run": {"drain": {"deliveries_per_s": {
        "p50": 400.0}}}}, ceilings, "push")
    assert ref["compared_with"] == "sdk_ceiling"
    assert ref["points"] == {
        "sdk_ceiling": {"msgs_per_s": 2000.0, "p50_ratio": 0.8, "mean_ratio": 0.5},
        "durable_ceiling": {"msgs_per_s": 8000.0, "p50_ratio": 0.2, "mean_ratio": 0.125},
        "raw_http_transport": {"msgs_per_s": 4000.0, "p50_ratio": 0.4, "mean_ratio": 0.25},
        "naive": {"msgs_per_s": 400.0, "p50_ratio": 4.0, "mean_ratio": 2.5},
    }
    target = next(t for t in report.evaluate_targets(_tiered(p50=1600.0), None, ref, 1_000_000, "push")
                  if t["name"].startswith("platform ÷"))
    assert (target["name"], target["value"], target["met"]) == (
        "platform ÷ sdk ceiling (p50 rate / ceiling msgs/s)", 0.8, True)
    assert report.compared_with("email") == "durable_ceiling" and report.compared_with("sms") == "sdk_ceiling"


def test_reference_points_without_a_tiered_rate_have_no_ratios():
    ref = report.reference_points(None, None, {"durable_ceiling": {"msgs_per_s": 8000.0}}, "email")
    assert ref["points"] == {"durable_ceiling": {"msgs_per_s": 8000.0, "p50_ratio": None, "mean_ratio": None}}


def test_summary_and_docs_list_every_reference_point_even_an_unmeasured_one():
    ceiling = {"processes": 4, "batch_size": 500, "concurrency": 4, "client_cpu_us_per_msg": 9.0,
               "emulator_cpu_us_per_msg": 1.0, "database_cpu_us_per_msg": 40.0, "mode": "durable", "msgs_per_s": 8000.0}
    result = {"tiered": _tiered(p50=4000.0), "durable_ceiling": ceiling,
              "raw_ceiling": {**ceiling, "mode": "sdk", "msgs_per_s": None}}
    result["reference"] = report.reference_points(result["tiered"], None, result, "email")
    text = report.summary_text({**result, "tiered": None})
    durable = report.CEILING_TITLES["durable_ceiling"]
    assert f"{durable} (the target's): 8,000.0 msgs/s" in text
    assert "Postgres + Redis 40.0 CPU-µs/msg); platform ÷ it: p50 0.5, mean 0.5" in text
    assert "raw ceiling: send_batch in a loop, no database (email: JSON building): not measured" in text
    docs = report.docs_section({**result, "tiered": None}, "x.json", "x.png")
    assert f"| {durable} **(the target's)** | 8,000.0 |" in docs


def test_sanity_problems():
    ok = {"run": {"timed_out": False, "lost": {"total": 0}, "otp": {"refused": 0, "missing": 0, "accepted": 5,
                                                                    "sent": 5}}}
    assert report.sanity_problems(ok) == []
    bad = {"run": {"timed_out": True, "lost": {"total": 2}, "otp": {"refused": 0, "missing": 1, "accepted": 5,
                                                                    "sent": 5, "missing_examples": ["x"]}}}
    problems = report.sanity_problems(bad)
    assert len(problems) == 3 and problems[2] == "1 OTP(s) never reached the provider: ['x']"
    assert report.sanity_problems(None) == ["the tiered run did not complete"]


def test_docs_block_is_replaced_in_place():
    text = f"# Perf\n\nintro\n\n{report.DOCS_START}\nold\n{report.DOCS_END}\n\n## How to read\n"
    assert report.replace_docs_section(text, "NEW") == "# Perf\n\nintro\n\nNEW\n\n## How to read\n"
    assert report.replace_docs_section("# Perf\n", "NEW") == "# Perf\n\nNEW\n"


def test_docs_section_puts_the_runs_side_by_side():
    def run(channel, p99, drain):
        tiered = _tiered(p99=p99)
        tiered["run"]["drain"]["seconds"] = drain
        tiered["run"]["otp"].update(delivered=10, accepted=10)
        tiered["run"]["lost"] = {"total": 0}
        return {"options": {"channel": channel, "argv": f"--channel {channel}"}, "git": {"commit": "abc"},
                "tiered": tiered, "targets": report.evaluate_targets(tiered, None, None, 1_000_000, channel)}

    text = report.docs_section_runs([(run("email", 300.0, 150.0), "e.json", "PERFORMANCE-email.png"),
                                     (run("push", 1200.0, 450.0), "p.json", "PERFORMANCE-push.png")])
    lines = text.splitlines()
    assert "| figure (tiered platform) | email | push |" in lines
    assert "| drain (s) | 150.0 | 450.0 |" in lines
    assert ("| OTP accept→provider p99 during the blast (target < 1,000 ms) | 300 ms ✓ | "
            "**1,200 ms** (over by 20% (1,200 vs < 1,000)) |") in lines
    assert "| 1M drained (target ≤ 200 s / ≤ 400 s) | 150 s ✓ | **450 s** (over by 12% (450 vs ≤ 400)) |" in lines
    assert lines[-3:-1] == ["![email: deliveries/s per tier and OTP latency](PERFORMANCE-email.png)",
                            "![push: deliveries/s per tier and OTP latency](PERFORMANCE-push.png)"]

"""bench.stats: pure statistics of a bench run (no processes, no database)."""

from bench import stats


def test_percentile_interpolates_between_ranks():
    values = [10, 20, 30, 40, 50]
    assert stats.percentile(values, 0) == 10
    assert stats.percentile(values, 50) == 30
    assert stats.percentile(values, 100) == 50
    assert stats.percentile(values, 25) == 20
    assert stats.percentile(values, 90) == 46.0  # rank 3.6: 40 + 0.6 × 10
    assert stats.percentile([7], 99) == 7
    assert stats.percentile([], 50) is None


def test_percentile_does_not_depend_on_order():
    assert stats.percentile([5, 1, 4, 2, 3], 50) == 3


def test_latency_summary():
    values = list(range(1, 101))  # 1..100 ms
    assert stats.latency_summary(values) == {"count": 100, "p50": 50.5, "p95": 95.0, "p99": 99.0, "max": 100,
                                             "mean": 50.5}
    assert stats.latency_summary([]) == {"count": 0, "p50": None, "p95": None, "p99": None, "max": None,
                                         "mean": None}


def test_bucket_series_fills_gaps_and_clips_to_the_window():
    buckets = [[1000, 5], [3000, 7], [9000, 1]]
    assert stats.bucket_series(buckets, 1500, 4200) == [5, 0, 7, 0]
    assert stats.bucket_series(buckets, 0, 999) == [0]
    assert stats.bucket_series(buckets, 5000, 4000) == []
    assert stats.bucket_series([[200, 1], [300, 2], [1100, 4]], 0, 1999, 1000) == [3, 4]


def test_rate_summary():
    assert stats.rate_summary(1000, 4.0, [100, 300, 400, 200]) == {"mean": 250.0, "p50": 250.0, "peak": 400}
    assert stats.rate_summary(0, None, []) == {"mean": None, "p50": None, "peak": None}


def test_series_from_times():
    assert stats.series_from_times([1001, 1999, 2000, 5500], 1000) == [[1000, 2], [2000, 1], [5000, 1]]
    assert stats.series_from_times([120, 180, 250], 100) == [[100, 2], [200, 1]]


def test_subtract_series_drops_emptied_buckets():
    assert stats.subtract_series([[0, 5], [100, 2], [200, 3]], [[100, 2], [200, 1]]) == [[0, 5], [200, 2]]


def test_sum_buckets():
    per_bucket = {"twilio": [[0, 1], [1000, 2]], "sendgrid": [[1000, 3]], "fcm": []}
    assert stats.sum_buckets(per_bucket) == [[0, 1], [1000, 5]]
    assert stats.sum_buckets(per_bucket, ["sendgrid"]) == [[1000, 3]]


def _message(provider, nid, at, account=None):
    return {"provider": provider, "notification_id": nid, "received_at_ms": at, "account": account}


def test_analyze_messages_matches_the_endpoint_shape():
    messages = [
        _message("sendgrid", "a", 1000),
        _message("sendgrid", "b", 1100),
        _message("sendgrid", "a", 2500),  # duplicate of a
        _message("twilio", "otp1", 1200, "AC0"),
        _message("twilio", None, 1300, "AC1"),
    ]
    result = stats.analyze_messages(messages, ["otp1", "missing"], 1000)
    assert result == {
        "total": 5,
        "by_provider": {"sendgrid": 3, "twilio": 2},
        "by_account": {"": 3, "AC0": 1, "AC1": 1},
        "unique_notification_ids": 3,
        "duplicates": {"messages": 1, "ids": 1, "examples": ["a"]},
        "received_at_ms": {"otp1": [1200]},
        "per_bucket": {"sendgrid": [[1000, 2], [2000, 1]], "twilio": [[1000, 2]]},
        "first_ms": 1000,
        "last_ms": 2500,
    }


def test_otp_latencies_use_the_first_receipt():
    accepted = [{"id": "x", "accept_ms": 1000.0}, {"id": "y", "accept_ms": 1500.0}, {"id": "z", "accept_ms": 1.0}]
    received = {"x": [1250, 1300], "y": [1900]}
    assert stats.otp_latencies(accepted, received) == ([250.0, 400.0], ["z"])


def test_cpu_us_per_message_and_growth():
    cpu = {"web": 1.0, "worker_standard": 3.0, "emulator": 0.5}
    assert stats.cpu_us_per_message(cpu, ["web", "worker_standard", "postgres"], 20_000) == 200.0
    assert stats.cpu_us_per_message(cpu, ["emulator"], 0) is None
    assert stats.growth(100.0, 110.0) == 0.1
    assert stats.growth(0, 10) is None
    assert stats.growth(100.0, None) is None


def test_cpu_ms_per_notification_by_kind_and_total():
    from bench.stats import cpu_ms_per_notification

    cpu = {"web": 1.5, "worker_high": 0.75, "postgres": 0.25, "emulator": 9.0}
    assert cpu_ms_per_notification(cpu, ("web", "worker_high", "postgres", "redis"), 500) == {
        "total": 5.0, "web": 3.0, "worker_high": 1.5, "postgres": 0.5, "redis": 0.0}
    assert cpu_ms_per_notification(cpu, ("web",), 0) == {"total": None, "web": None}

"""The provider health page's last hour (docs/OPERATIONS.md, "Provider health page"; issue 27 part 2):
beat's sampler rolls the delivery log up per provider and minute past its high-water mark, merges a
minute split across two samples, records the breaker's open spells; the page draws at most 60 rows
per provider, with a summary that stays without JavaScript. In-process, real Postgres and Redis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core import clock, partitions
from notifications.models import DeliveryAttempt
from notifications.provider_minutes import last_hour, sampler
from notifications.provider_minutes.models import ProviderMinute, RollupMark
from providers import isolation
from tests.conftest import reset_isolation

pytestmark = pytest.mark.django_db

BASE = datetime(2030, 1, 10, 11, 30, 0, tzinfo=UTC)
CONFIGURED = ["twilio", "twilio_backup", "sendgrid", "smtp", "fcm"]


@pytest.fixture(autouse=True)
def _no_breaker_state():
    reset_isolation()
    yield
    reset_isolation()


def attempts(provider: str, at: datetime, *outcomes_and_latencies: tuple, error_code: str = "") -> None:
    DeliveryAttempt.objects.bulk_create([
        DeliveryAttempt(notification_id=uuid.uuid4(), number=1, provider=provider, outcome=outcome,
                        latency_ms=latency, created_at=at, error_code=error_code)
        for outcome, latency in outcomes_and_latencies])


def rows() -> dict[tuple[str, str], tuple]:
    return {(r.provider, f"{r.minute:%H:%M}"): (r.requests, r.errors, r.latency_p95_ms, r.breaker_state)
            for r in ProviderMinute.objects.all()}


def test_attempts_roll_up_per_minute_and_a_split_minute_is_merged():
    assert sampler.sample(BASE + timedelta(seconds=10))["attempts"] == 0  # the mark starts at the newest id
    # 11:30:20: 5 calls (one transient error; contact_invalid is the recipient's) and an unknown (no call).
    attempts("twilio", BASE + timedelta(seconds=20), ("accepted", 100), ("accepted", 200), ("accepted", 300),
             ("transient", 1000), ("contact_invalid", 50), ("unknown", None))
    assert sampler.sample(BASE + timedelta(seconds=30)) == {"attempts": 6, "behind": False, "deleted": 0}
    # p95 of 50, 100, 200, 300, 1000 (interpolated): 300 + 0.8 × 700.
    assert rows()[("twilio", "11:30")] == (5, 1, 860, "closed")

    # The clock moves on: two more calls land in 11:30 after the sample, one in 11:31 for sendgrid.
    attempts("twilio", BASE + timedelta(seconds=50), ("accepted", 100), ("permanent", 2100))
    attempts("sendgrid", BASE + timedelta(seconds=65), ("configuration", None))
    assert sampler.sample(BASE + timedelta(seconds=70))["attempts"] == 3
    found = rows()
    # 11:30 merged: counts added, p95 the larger of 860 and the new part's 2000 (100 + 0.95 × 2000).
    assert found[("twilio", "11:30")] == (7, 2, 2000, "closed")
    assert found[("sendgrid", "11:31")] == (1, 1, None, "closed")
    assert found[("twilio", "11:31")] == (0, 0, None, "closed")  # its breaker sample, no calls
    assert {p for p, m in found if m == "11:31"} == set(CONFIGURED)
    assert RollupMark.objects.get().last_id == DeliveryAttempt.objects.order_by("-id").first().pk
    assert sampler.sample(BASE + timedelta(seconds=80))["attempts"] == 0  # nothing counted twice

    hour = last_hour.last_hour(["twilio", "sendgrid"], now=BASE + timedelta(seconds=80))
    twilio = hour["providers"][0]
    assert twilio["labels"][0] == "10:32" and twilio["labels"][-2:] == ["11:30", "11:31"]
    assert twilio["attempts"][-3:] == [None, 7, 0]
    assert twilio["error_share"][-2:] == [28.6, None]
    assert twilio["p95_ms"][-2:] == [2000, None]
    assert twilio["breaker"][-3:] == [None, 0, 0]
    assert twilio["summary"]["text"] == ("7 attempts, error share 28.6% (2), worst p95 2,000 ms (at 11:30), "
                                         "breaker closed all along")
    assert hour["stale"] is False and hour["last_sample"] == BASE + timedelta(seconds=80)
    late = BASE + timedelta(seconds=80 + 3 * sampler.sample_seconds() + 1)  # three intervals without a sample
    assert last_hour.last_hour(["twilio"], now=late)["stale"] is True


def test_attempts_refused_before_a_call_are_no_calls_of_the_provider():
    """The last provider of a failover chain gets an attempt row (transient, circuit_open, 0 ms) for
    each send its open breaker refused: no call, so in no count, error share or p95 (hadv34 #3)."""
    sampler.sample(BASE + timedelta(seconds=10))
    attempts("twilio_backup", BASE + timedelta(seconds=20), ("accepted", 400), ("transient", 900))
    for code in ("circuit_open", "bulkhead_full", "budget_exhausted"):
        attempts("twilio_backup", BASE + timedelta(seconds=25), *[("transient", 0)] * 3, error_code=code)
    assert sampler.sample(BASE + timedelta(seconds=30))["attempts"] == 11
    # p95 of 400 and 900 alone: 400 + 0.95 × 500.
    assert rows()[("twilio_backup", "11:30")] == (2, 1, 875, "closed")


def test_rows_older_than_the_keep_are_deleted(settings):
    settings.NOTIFY = {**settings.NOTIFY, "PROVIDER_HEALTH_KEEP_DAYS": 2}
    ProviderMinute.objects.create(provider="twilio", minute=BASE - timedelta(days=2, minutes=1), requests=3)
    ProviderMinute.objects.create(provider="twilio", minute=BASE - timedelta(days=1), requests=4)
    assert sampler.sample(BASE)["deleted"] == 1
    assert sorted(ProviderMinute.objects.values_list("requests", flat=True)) == [0, 0, 0, 0, 0, 4]


def test_a_breaker_opened_then_closed_is_one_spell_with_its_start_and_end():
    sampler.sample()
    assert isolation.record_calls("twilio", failed=20) == "open"  # 20 calls, 100 % failed
    began = datetime.fromtimestamp(isolation.breaker_state("twilio")["since_ms"] / 1000, UTC)
    sampler.sample()
    open_row = ProviderMinute.objects.filter(provider="twilio").order_by("-sampled_at").first()
    assert (open_row.breaker_state, open_row.spell_began, open_row.spell_ended) == ("open", began, None)

    assert isolation.record_calls("twilio", ok=1, probe=True) == "closed"  # the probe succeeded
    ended = datetime.fromtimestamp(isolation.breaker_state("twilio")["closed_ms"] / 1000, UTC)
    sampler.sample()
    closed_row = ProviderMinute.objects.filter(provider="twilio").order_by("-sampled_at").first()
    assert (closed_row.breaker_state, closed_row.spell_began, closed_row.spell_ended) == ("closed", began, ended)
    assert sum(ProviderMinute.objects.filter(provider="twilio").values_list("breaker_opened", flat=True)) == 1
    sampler.sample()  # a later sample does not see the spell again
    assert ProviderMinute.objects.filter(provider="twilio", spell_ended=ended).count() == 1

    twilio = last_hour.last_hour(["twilio"])["providers"][0]
    seconds = round((ended - began).total_seconds())
    assert twilio["summary"]["spells"] == [{"began": began, "ended": ended, "seconds": seconds}]
    assert twilio["summary"]["text"].endswith(
        f"breaker open 1×: {began:%H:%M:%S}–{ended:%H:%M:%S} ({seconds} s)")
    assert twilio["breaker"][twilio["labels"].index(f"{began:%H:%M}")] == 1
    assert twilio["rule"] == ("Open: at least 20 calls in 10 s and 50% or more of them failed (timeouts, connection "
                              "errors, 5xx); calls then fail fast for 15 s, then one probe call goes through: it "
                              "closes the breaker if it succeeds, opens it again if it fails.")


def test_a_spell_still_open_says_so():
    sampler.sample()
    isolation.record_calls("sendgrid", failed=25)
    sampler.sample()
    text = last_hour.last_hour(["sendgrid"])["providers"][0]["summary"]["text"]
    began = datetime.fromtimestamp(isolation.breaker_state("sendgrid")["since_ms"] / 1000, UTC)
    assert text == f"0 attempts, error share –, worst p95 –, breaker open 1×: {began:%H:%M:%S}, still open"


# --- bounded: the page and the sampler -------------------------------------------------------------------

def test_the_page_reads_at_most_an_hour_of_rows_in_one_query_however_many_are_kept():
    now = clock.now()
    ProviderMinute.objects.bulk_create([
        ProviderMinute(provider=name, minute=sampler.minute_of(now) - timedelta(minutes=k), requests=1,
                       sampled_at=now) for name in CONFIGURED for k in range(3 * 1440)])
    with CaptureQueriesContext(connection) as queries:
        hour = last_hour.last_hour(CONFIGURED, now=now)
    assert len(queries) == 1
    assert [p["summary"]["attempts"] for p in hour["providers"]] == [60] * 5
    plan = _explain(queries[0]["sql"])
    assert "provider_minute_uniq" in plan or "provider_minute_minute_idx" in plan, plan


def test_the_sampler_costs_the_same_queries_for_3_or_300_attempts():
    sampler.sample(BASE)
    attempts("twilio", BASE + timedelta(seconds=5), *[("accepted", 10)] * 3)
    with CaptureQueriesContext(connection) as few:
        sampler.sample(BASE + timedelta(seconds=10))
    attempts("twilio", BASE + timedelta(seconds=15), *[("accepted", 10)] * 300)
    with CaptureQueriesContext(connection) as many:
        sampler.sample(BASE + timedelta(seconds=20))
    assert len(few) == len(many)
    assert rows()[("twilio", "11:30")][:2] == (303, 0)


def test_the_sampler_reads_past_its_mark_by_primary_key_not_by_scanning_the_log():
    """200,000 attempts across two day partitions: the batch read is index scans on each partition's
    primary key under a LIMIT, never a sequential scan of the log."""
    today = clock.now().date()
    for day in (today - timedelta(days=1), today):
        if partitions.partition_name(DeliveryAttempt._meta.db_table, day) not in _tables():
            partitions.create_day(DeliveryAttempt._meta.db_table, "created_at", day)
    with connection.cursor() as cur:
        cur.execute(f"""INSERT INTO {DeliveryAttempt._meta.db_table}
                        (notification_id, number, provider, outcome, error_code, error_message,
                         provider_message_id, latency_ms, created_at)
                        SELECT gen_random_uuid(), 1, 'twilio', 'accepted', '', '', '', 10,
                               now() - (g % 2) * interval '1 day' FROM generate_series(1, 200000) AS g""")
        cur.execute(f"ANALYZE {DeliveryAttempt._meta.db_table}")
        cur.execute("SELECT max(id) - 100 FROM notifications_deliveryattempt")
        after = cur.fetchone()[0]
    plan = _explain(sampler._BATCH_SQL, {"after": after, "limit": sampler.BATCH, "calls": ["accepted"],
                                          "errors": ["transient"], "not_called": ["circuit_open"]})
    assert "Seq Scan" not in plan, plan
    assert "Limit" in plan and plan.count("Index Scan using notifications_deliveryattempt_p") == 2, plan


def _tables() -> set[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables")
        return {name for (name,) in cur.fetchall()}


def _explain(sql: str, params=None) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params)
        return "\n".join(line for (line,) in cur.fetchall())


def test_the_page_shows_each_providers_last_hour_beside_its_tables(admin_client):
    sampler.sample()
    attempts("twilio", clock.now(), ("accepted", 120), ("transient", 900))
    sampler.sample()
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get("/admin/provider-health/")
    assert response.status_code == 200
    hour = response.context_data["last_hour"]
    assert [p["name"] for p in hour["providers"]] == CONFIGURED
    assert hour["providers"][0]["summary"]["text"] == ("2 attempts, error share 50.0% (1), worst p95 861 ms "
                                                       f"(at {sampler.minute_of(clock.now()):%H:%M}), "
                                                       "breaker closed all along")
    html = response.content.decode()
    assert '<p class="last-hour-summary" data-provider="twilio">Last hour: 2 attempts, error share 50.0% (1)' in html
    assert 'id="last-hour-twilio-breaker"' in html and 'id="last-hour-data"' in html
    assert "transient + permanent + configuration" in html
    # Attempts, not HTTP requests: a SendGrid request of up to 1,000 emails is that many attempts.
    assert ("not an HTTP request: SendGrid sends up to 1,000 emails in one request, each its own attempt. Its\n"
            "breaker counts that request once, so the calls of its rule below are requests.") in html
    assert 'aria-label="twilio: attempts / min per minute, last hour"' in html
    assert sum("notifications_providerminute" in q["sql"] for q in queries) == 1

"""Frequency caps (notifications/delivery/caps.py, docs/POLICIES.md) in-process against real
Postgres and Redis: the Lua window (limit, rolling expiry, one slot per id, a capped row holds
none), the rebuild from Postgres after a flush, exemptions and rules from settings and the admin,
Redis down, the pipeline's caps step with a real emulator, and a Hypothesis test over generated
send sequences against a plain model of the rule. tests/test_e2e_caps.py runs it with real workers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core.redis_client import get_redis
from notifications.delivery import caps
from notifications.delivery.pipeline import send_notifications
from notifications.delivery.types import Row
from notifications.events.models import NotificationType
from notifications.models import DeliveryEvent, FrequencyCap, Notification
from preferences.models import Device, Recipient
from providers.registry import reset_backends
from tests.providers.conftest import fcm_options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
PUSH_3_A_DAY = [{"name": "marketing-push", "category": "marketing", "channel": "push", "limit": 3,
                 "window_seconds": 86400}]


@pytest.fixture
def user():
    return Recipient.objects.create(user_id=f"cap-{uuid.uuid4().hex[:10]}", email="cap@example.com")


def row(recipient, *, category="marketing", channel="push", priority="standard", status="queued", **fields):
    """A notification (``queued``: one in flight, ``sending``, would count in a rebuild)."""
    return Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel=channel, category=category,
                                       priority=priority, body="b", status=status, **{"attempts": 1, **fields})


def no_type(_n):
    return None


def admitted(rows, at, kind_of=no_type) -> list[bool]:
    taken = caps.take(rows, kind_of, at)
    assert taken.unchecked == []
    return [n.pk not in taken.capped for n in rows]


def window_of(n) -> dict[str, float]:
    return {m.decode(): s for m, s in get_redis().zrange(f"fcap:{n.category}:{n.channel}:{n.recipient_id}", 0, -1,
                                                         withscores=True)}


# --- the window ------------------------------------------------------------------------------------

def test_the_limit_admits_three_and_caps_the_fourth_naming_the_rule(user):
    rows = [row(user) for _ in range(4)]
    taken = caps.take(rows, no_type, T0)
    assert [n.pk in taken.capped for n in rows] == [False, False, False, True]
    assert taken.capped[rows[3].pk] == ("marketing push: at most 3 per 24 h; 3 sent since 2026-12-02 10:00 UTC "
                                        "(rule marketing-push)")
    assert set(window_of(rows[0])) == {str(n.pk) for n in rows[:3]}  # the capped row holds no slot


def test_the_window_rolls_a_slot_frees_exactly_a_window_after_it_was_taken(user):
    a, b, c, d, e, f = (row(user) for _ in range(6))
    assert admitted([a], T0) == [True]
    assert admitted([b], T0 + timedelta(hours=1)) == [True]
    assert admitted([c], T0 + timedelta(hours=2)) == [True]
    assert admitted([d], T0 + timedelta(hours=23, minutes=59)) == [False]
    assert admitted([d], T0 + timedelta(hours=24)) == [True]  # a's slot, taken at T0, has left the window
    assert admitted([e], T0 + timedelta(hours=24, minutes=1)) == [False]  # b's is still in it
    taken = caps.take([f], no_type, T0 + timedelta(hours=24, minutes=30))
    assert taken.capped[f.pk].endswith("3 sent since 2026-12-02 11:00 UTC (rule marketing-push)")


def test_the_same_id_twice_takes_one_slot(user):
    a, b, c, d = (row(user) for _ in range(4))
    assert admitted([a], T0) == [True]
    assert admitted([a], T0 + timedelta(minutes=1)) == [True]  # re-driven: its own slot
    assert window_of(a) == {str(a.pk): T0.timestamp() * 1000}
    assert admitted([b, c, d], T0 + timedelta(minutes=2)) == [True, True, False]
    assert admitted([a], T0 + timedelta(minutes=3)) == [True]  # still its own slot, not a fourth
    assert len(window_of(a)) == 3


def test_a_slot_given_back_is_free_again(user):
    a, b, c, d = (row(user) for _ in range(4))
    assert admitted([a, b, c], T0) == [True, True, True]
    caps.give_back([b])
    assert admitted([d], T0 + timedelta(minutes=1)) == [True]
    assert set(window_of(a)) == {str(a.pk), str(c.pk), str(d.pk)}


def test_keys_are_per_user_category_and_channel(user):
    other = Recipient.objects.create(user_id=f"cap-{uuid.uuid4().hex[:10]}")
    mine = [row(user) for _ in range(3)]
    assert admitted(mine, T0) == [True] * 3
    assert admitted([row(other), row(user, channel="email"), row(user, category="orders"), row(user)],
                    T0) == [True, True, True, False]


# --- rebuilt from Postgres -----------------------------------------------------------------------------

def test_after_a_flush_the_window_is_rebuilt_from_postgres_before_the_first_decision(user):
    row(user, status="sent", sent_at=T0 - timedelta(hours=30))  # before the window: not counted
    row(user, status="sent", sent_at=T0 - timedelta(hours=5))
    row(user, status="delivered", sent_at=T0 - timedelta(hours=4))
    row(user, status="sent", sent_at=T0 - timedelta(hours=3), priority="high", category="orders")  # another key
    first = row(user)
    assert admitted([first], T0) == [True]  # no sentinel yet: rebuilt (2 in the window), then decided
    Notification.objects.filter(pk=first.pk).update(status="sent", sent_at=T0)
    get_redis().flushdb()
    later = row(user)
    taken = caps.take([later], no_type, T0 + timedelta(minutes=5))
    assert taken.capped[later.pk] == ("marketing push: at most 3 per 24 h; 3 sent since 2026-12-02 05:00 UTC "
                                      "(rule marketing-push)")
    assert window_of(first) == {str(first.pk): T0.timestamp() * 1000,  # its slot, from sent_at
                                **{str(n.pk): n.sent_at.timestamp() * 1000 for n in Notification.objects.filter(
                                    recipient=user, category="marketing", sent_at__gt=T0 - timedelta(hours=6))
                                   .exclude(pk=first.pk)}}


def test_once_slots_have_been_tracked_for_a_whole_window_a_key_without_one_needs_no_rebuild(
        user, django_assert_num_queries):
    """The tracking marker of (marketing, push, 24 h) is set by the first decision; a window later a
    user who has no slot in Redis has none anywhere (every slot since was taken here): no query. A
    flush removes the marker with the windows, and the next decision rebuilds again."""
    other = Recipient.objects.create(user_id=f"cap-{uuid.uuid4().hex[:8]}")
    assert admitted([row(other)], T0) == [True]  # sets the marker at T0 (this key rebuilt: the marker is new)
    later = T0 + timedelta(hours=24, seconds=1)
    fresh = row(user)
    with django_assert_num_queries(1):  # the rules; no rebuild query
        assert caps.take([fresh], no_type, later).capped == {}
    get_redis().flushdb()  # the marker goes with the windows
    for hours in (1, 2, 3):
        row(user, status="sent", sent_at=later - timedelta(hours=hours))
    # Rebuilt from Postgres again: the three sent rows fill the window (fresh's slot went with the flush,
    # and its row was never sent).
    assert admitted([row(user)], later + timedelta(seconds=1)) == [False]


def test_rows_in_flight_after_a_lost_lease_count_in_the_rebuild(user):
    row(user, status="scheduled", reason="lease_expired", updated_at=T0 - timedelta(minutes=10))
    row(user, status="scheduled", reason="outcome_unknown", updated_at=T0 - timedelta(minutes=9))
    row(user, status="scheduled", reason="quiet_hours", updated_at=T0 - timedelta(minutes=8))  # holds no slot
    row(user, status="sending", updated_at=T0 - timedelta(minutes=1))  # mid-call: not read (caps._MAY_HOLD)
    mine, nxt = row(user), row(user)
    assert admitted([mine, nxt], T0) == [True, False]
    assert len(window_of(mine)) == 3  # the two in doubt, and mine


def test_a_rebuilt_row_that_had_no_slot_cannot_pass_the_limit_by_being_seeded(user):
    """Worker A rebuilds while B's row is claimed but not yet decided: A seeds it (in flight); when
    B decides it, it is admitted only if it is among the first `limit` of the window."""
    for hours in (5, 4, 3):
        row(user, status="sent", sent_at=T0 - timedelta(hours=hours))
    b_row = row(user, updated_at=T0 - timedelta(seconds=2))
    a_row = row(user)
    assert admitted([a_row], T0) == [False]  # A's rebuild counts 3 sent (+ B's row in flight)
    assert admitted([b_row], T0 + timedelta(seconds=1)) == [False]
    assert str(b_row.pk) not in window_of(b_row)  # capped: its seeded slot is removed


# --- rules: settings, admin rows, exemptions ------------------------------------------------------------

def test_high_priority_and_required_types_are_exempt_unless_the_rule_includes_them(user):
    required = NotificationType.objects.create(key=f"req-{uuid.uuid4().hex[:6]}", name="r", category="marketing",
                                               channels=["push"], required=True)
    full = [row(user) for _ in range(3)]
    assert admitted(full, T0) == [True] * 3
    high, req = row(user, priority="high"), row(user, notification_type=required)
    kinds = {req.pk: required}
    assert admitted([high, req], T0, lambda n: kinds.get(n.pk)) == [True, True]
    assert set(window_of(high)) == {str(n.pk) for n in full}  # exempt rows take no slot
    FrequencyCap.objects.create(name="marketing-push", category="marketing", channel="push", limit=3,
                                window_seconds=86400, include_high=True, include_required=True)
    assert admitted([high, req], T0, lambda n: kinds.get(n.pk)) == [False, False]


def test_a_rebuild_leaves_out_the_exempt_rows_a_rule_does_not_include(user):
    required = NotificationType.objects.create(key=f"req-{uuid.uuid4().hex[:6]}", name="r", category="marketing",
                                               channels=["push"], required=True)
    sent = {"status": "sent", "sent_at": T0 - timedelta(hours=1)}
    row(user, priority="high", **sent)
    row(user, notification_type=required, **sent)
    row(user, **sent)
    a, b, c = row(user), row(user), row(user)
    assert admitted([a, b, c], T0) == [True, True, False]  # 1 counted: the standard one
    get_redis().flushdb()
    FrequencyCap.objects.create(name="marketing-push", category="marketing", channel="push", limit=4,
                                window_seconds=86400, include_high=True)
    Notification.objects.filter(pk__in=[a.pk, b.pk]).update(status="sent", sent_at=T0)
    assert admitted([c], T0) == [False]  # the high one counts now: 4 with a and b


def test_admin_rows_add_rules_and_override_settings_rules_by_name(user):
    FrequencyCap.objects.create(name="marketing-push", category="marketing", channel="push", limit=1,
                                window_seconds=3600)
    FrequencyCap.objects.create(name="news-email", category="news", channel="email", limit=0, window_seconds=60)
    assert [(r.name, r.limit, r.window_seconds, r.source) for r in caps.rules()] == [
        ("marketing-push", 1, 3600, "admin"), ("news-email", 0, 60, "admin")]
    a, b, news = row(user), row(user), row(user, category="news", channel="email")
    taken = caps.take([a, b, news], no_type, T0)
    assert taken.capped == {
        b.pk: "marketing push: at most 1 per 1 h; 1 sent since 2026-12-02 10:00 UTC (rule marketing-push)",
        news.pk: "news email: none allowed (rule news-email, limit 0)"}
    FrequencyCap.objects.filter(name="marketing-push").update(active=False)
    assert admitted([b], T0) == [True]  # the settings rule is switched off by its row


def test_several_rules_on_one_key_each_apply(user):
    FrequencyCap.objects.create(name="marketing-push-hour", category="marketing", channel="push", limit=1,
                                window_seconds=3600)
    a, b, c, d = (row(user) for _ in range(4))
    assert admitted([a, b], T0) == [True, False]
    assert admitted([b], T0 + timedelta(hours=1)) == [True]
    assert admitted([c], T0 + timedelta(hours=2)) == [True]
    taken = caps.take([d], no_type, T0 + timedelta(hours=3))
    assert taken.capped[d.pk].startswith("marketing push: at most 3 per 24 h; 3 sent since 2026-12-02 10:00 UTC")


@override_settings(NOTIFY={"FREQUENCY_CAPS": [{"name": "x", "category": "marketing", "channel": "push"}]})
def test_a_settings_rule_without_its_fields_is_a_configuration_error():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="lacks limit, window_seconds"):
        caps.rules()


# --- Redis down ----------------------------------------------------------------------------------------

def test_a_redis_error_sends_nothing_uncapped_the_rows_wait_as_a_transient_error(user, monkeypatch):
    def down(_source):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(caps, "script", down)
    capped_rows = [row(user, status="sending") for _ in range(2)]
    other = row(user, category="orders", status="sending")
    left = caps.admit([Row(n) for n in [*capped_rows, other]], no_type, T0)
    assert [r.n.pk for r in left] == [other.pk]
    for n in capped_rows:
        n.refresh_from_db()
        assert (n.status, n.reason, n.attempts) == ("scheduled", "retry_scheduled", 0)
        assert n.reason_detail.startswith("frequency cap not checked (Redis error); retry in ")
        assert T0 <= n.due_at <= T0 + timedelta(seconds=10)


# --- the pipeline ----------------------------------------------------------------------------------------

@pytest.fixture
def push_provider(settings, module_emulator):
    module_emulator.reset()
    name = f"fcm{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "push": [
        {"NAME": name, "BACKEND": "providers.fcm.backend.FcmPushBackend", "OPTIONS": fcm_options(module_emulator)}]}
    reset_backends()
    yield name
    reset_backends()


def test_the_pipeline_sends_three_and_suppresses_the_rest_with_the_reason(user, push_provider, module_emulator):
    Device.objects.create(recipient=user, platform="android", push_token=f"tok-{user.user_id}")
    ids = [str(row(user, attempts=0).pk) for _ in range(5)]
    send_notifications(ids)
    rows = {str(n.pk): n for n in Notification.objects.filter(pk__in=ids)}
    sent = sorted(i for i, n in rows.items() if n.status == "sent")
    capped = sorted(i for i, n in rows.items() if (n.status, n.reason) == ("suppressed", "frequency_capped"))
    assert (len(sent), len(capped)) == (3, 2)
    assert sorted(m["notification_id"] for m in module_emulator.messages()) == sent
    for i in capped:
        assert rows[i].reason_detail.startswith("marketing push: at most 3 per 24 h; 3 sent since ")
        assert list(DeliveryEvent.objects.filter(notification_id=i).values_list("kind", "reason")) == [
            ("suppressed", "frequency_capped")]


def test_a_row_that_fails_for_good_gives_its_slot_back(user, push_provider, module_emulator):
    Device.objects.create(recipient=user, platform="android", push_token=f"tok-{user.user_id}")
    module_emulator.fault(provider="fcm", status=400, code="INVALID_ARGUMENT", times=1)
    ids = [str(row(user, attempts=0).pk) for _ in range(3)]
    send_notifications(ids)
    rows = Notification.objects.filter(pk__in=ids)
    assert sorted(rows.values_list("status", "reason")) == [("failed", "permanent_error"), ("sent", ""), ("sent", "")]
    assert set(window_of(rows[0])) == {str(n.pk) for n in rows if n.status == "sent"}
    later = str(row(user, attempts=0).pk)
    send_notifications([later])
    assert Notification.objects.get(pk=later).status == "sent"  # the failed one's slot was free


def test_a_widened_window_is_rebuilt_from_postgres(user):
    FrequencyCap.objects.create(name="marketing-push", category="marketing", channel="push", limit=2,
                                window_seconds=3600)
    row(user, status="sent", sent_at=T0 - timedelta(hours=2))
    a, b = row(user), row(user)
    assert admitted([a], T0) == [True]  # built for 1 h: the send 2 h ago is outside
    FrequencyCap.objects.filter(name="marketing-push").update(window_seconds=86400)
    Notification.objects.filter(pk=a.pk).update(status="sent", sent_at=T0)
    assert admitted([b], T0) == [False]  # built for 1 h < 24 h: rebuilt, the one 2 h ago counts


def test_a_capped_channel_of_a_fallback_type_releases_the_next(user):
    from notifications.events import services
    from notifications.models import APIClient

    kind = NotificationType.objects.create(key=f"promo-{uuid.uuid4().hex[:6]}", name="p", category="marketing",
                                           channels=["push", "email"], routing="fallback")
    client = APIClient.objects.create_key(name=f"caps-{uuid.uuid4().hex[:6]}")[0]
    accepted = services.accept_event(client=client, idempotency_key=uuid.uuid4().hex, fingerprint="f", kind=kind,
                                     recipients=[user], data={})
    push, email = sorted(accepted.notifications, key=lambda n: n.channel != "push")
    assert admitted([row(user) for _ in range(3)], T0) == [True] * 3
    Notification.objects.filter(pk=push.pk).update(status="sending", attempts=1)
    push.refresh_from_db()
    assert caps.admit([Row(push)], no_type, T0) == []
    assert Notification.objects.get(pk=push.pk).reason == "frequency_capped"
    assert Notification.objects.get(pk=email.pk).status == "queued"  # released, with its own checks


# --- generated sequences vs a model --------------------------------------------------------------------

class Model:
    """The rule in plain Python: each (category, channel, user) holds slots ``{id: instant}``; a row
    passes when, for each of its rules, fewer than ``limit`` other slots lie in ``(t - window, t]``
    (a row that holds a slot in that window: fewer than ``limit`` before its own); passing takes a
    slot at ``t`` unless it holds one within every rule's window. A row capped by a rule whose
    window holds its slot loses that slot; capped by another rule, it keeps it (it may have been sent)."""

    def __init__(self):
        self.slots: dict[tuple, dict[str, float]] = {}

    def decide(self, key, nid, t, rules, longest) -> bool:
        slots = self.slots.setdefault(key, {})
        for m in [m for m, s in slots.items() if s <= t - longest]:
            del slots[m]
        mine = slots.get(nid)
        for limit, window in rules:
            lo = t - window
            held = mine is not None and mine > lo
            before = sum(1 for m, s in slots.items() if lo < s and (s < mine if held else m != nid))
            if before >= limit:
                if held:  # past the limit inside its own slot's window: a slot it should not have
                    del slots[nid]
                return False
        if mine is None or any(mine <= t - window for _limit, window in rules):
            slots[nid] = t
        return True


rules_strategy = st.lists(st.tuples(st.sampled_from(["marketing", "news"]), st.sampled_from(["push", "email"]),
                                    st.integers(0, 3), st.sampled_from([10, 60, 100])),
                          min_size=1, max_size=3)
step = st.tuples(st.integers(0, 40),  # seconds since the step before
                 st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["marketing", "news", "orders"]),
                                    st.sampled_from(["push", "email"]), st.sampled_from(["standard", "high"]),
                                    st.integers(0, 1)),
                          min_size=1, max_size=4, unique_by=lambda t: t[0]))


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(rules=rules_strategy, steps=st.lists(step, min_size=1, max_size=12))
def test_generated_sequences_match_the_model(rules, steps):
    """Instants, ids (re-drives: the same id again), users, categories, channels, tiers and rules;
    every decision of the script equals the model's, and no window ever holds more than its limit."""
    tag = uuid.uuid4().hex[:8]
    configured = [{"name": f"r{i}", "category": c, "channel": ch, "limit": lim, "window_seconds": w}
                  for i, (c, ch, lim, w) in enumerate(rules)]
    model, ids, t = Model(), {}, T0
    new_slots: dict[tuple, list] = {}
    with override_settings(NOTIFY={"FREQUENCY_CAPS": configured}):
        for dt, batch in steps:
            t += timedelta(seconds=dt)
            rows = []
            for index, category, channel, priority, user in batch:
                nid = ids.setdefault((index, category, channel, user), uuid.uuid4())  # same index: a re-drive
                rows.append(Notification(id=nid, recipient_id=f"h-{tag}-{user}", category=category, channel=channel,
                                         priority=priority))
            taken = caps.take(rows, no_type, t)
            assert taken.unchecked == []
            for n in rows:
                mine = [(r["limit"], r["window_seconds"] * 1000) for r in configured
                        if (r["category"], r["channel"]) == (n.category, n.channel) and n.priority != "high"]
                key = (n.category, n.channel, n.recipient_id)
                ms = t.timestamp() * 1000
                if not mine:
                    assert n.pk not in taken.capped
                    continue
                longest = max(r["window_seconds"] * 1000 for r in configured
                              if (r["category"], r["channel"]) == key[:2])
                before = dict(model.slots.get(key, {}))
                expected = model.decide(key, str(n.pk), ms, mine, longest)
                assert (n.pk not in taken.capped) == expected, (n, t, before)
                if expected and model.slots[key].get(str(n.pk)) == ms and before.get(str(n.pk)) != ms:
                    new_slots.setdefault(key, []).append((ms, str(n.pk)))
    # The invariant, independent of the model: in any rule's window, at most `limit` slots were taken.
    for (category, channel, _user), taken_at in new_slots.items():
        for r in configured:
            if (r["category"], r["channel"]) != (category, channel):
                continue
            w = r["window_seconds"] * 1000
            for end, _nid in taken_at:
                assert len({nid for at, nid in taken_at if end - w < at <= end}) <= r["limit"]


# --- the admin ---------------------------------------------------------------------------------------------

def test_the_admin_lists_the_effective_rules_and_refuses_a_bad_row(admin_client, fast_password_hashing):
    FrequencyCap.objects.create(name="news-email", category="news", channel="email", limit=5, window_seconds=86400,
                                include_required=True)
    page = admin_client.get("/admin/notifications/frequencycap/").content.decode()
    effective = page.split('id="effective-caps"')[1].split("</table>")[0]
    assert effective.count('class="effective-cap"') == 2
    assert "marketing push: at most 3 per 24 h" in effective and "settings" in effective
    assert "news email: at most 5 per 24 h" in effective and "a row below" in effective
    r = admin_client.post("/admin/notifications/frequencycap/add/", {
        "name": "bad", "category": "Bad Cat", "channel": "push", "limit": "3", "window_seconds": "0"})
    assert r.status_code == 200
    assert set(r.context["adminform"].form.errors) == {"category", "window_seconds"}
    assert not FrequencyCap.objects.filter(name="bad").exists()


def test_a_bounce_gives_the_slot_back_and_a_rebuild_leaves_the_bounced_row_out(user):
    from notifications import receipts

    rows = [row(user) for _ in range(3)]
    assert admitted(rows, T0) == [True, True, True]
    Notification.objects.filter(pk__in=[n.pk for n in rows]).update(status="sent", sent_at=T0, provider="sendgrid")
    bounced = rows[0]
    receipts.apply_receipts([receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:{uuid.uuid4().hex}",
                                              kind=receipts.FAILED, raw="bounce", notification_id=str(bounced.pk))])
    assert Notification.objects.get(pk=bounced.pk).status == "failed"
    assert str(bounced.pk) not in window_of(bounced)
    assert admitted([row(user)], T0 + timedelta(minutes=1)) == [True]  # the bounced one's slot
    get_redis().flushdb()
    # Rebuilt from Postgres: two sent rows count, the bounced one does not (counted, it would make 3).
    assert admitted([row(user)], T0 + timedelta(minutes=2)) == [True]

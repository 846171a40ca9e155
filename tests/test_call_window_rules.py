"""The sliding window's bookkeeping (notifications/delivery/calls.py) over generated batches: rows of
1–3 calls (push devices), answers arriving in any order, some calls refused by the lease gate, any
record cadence. A fake backend at the provider interface (``send_batch(messages, concurrency, gate=,
on_result=)``) answers; budget, breaker and bulkhead are the real ones (Redis).

The rules: every call's outcome is noted exactly once; ``settle`` gets a row only when all its calls
have ended, never twice and never a row whose call was refused (lost: left to its lease); what
``settle`` did not get is exactly what the end of the batch records."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import clock
from core.redis_client import get_redis
from notifications.delivery import calls, leases
from notifications.delivery.calls import Item, call_standard
from notifications.models import Notification
from providers.base import CallSkipped, ContactInvalidError, OutboundMessage, SendResult

NAME = f"fake{uuid.uuid4().hex[:6]}"


class FakeBackend:
    """Answers each message in the given order with the given outcome (``ok`` or ``invalid``)."""

    name = NAME
    batch_api = False

    def __init__(self, answers: dict[str, str], order: list[int]) -> None:
        self.answers, self.order, self.calls = answers, order, []

    def send_batch(self, messages, concurrency=1, *, gate=None, on_result=None):
        results: list = [None] * len(messages)
        for i in sorted(range(len(messages)), key=lambda i: self.order[i % len(self.order)] * 1000 + i):
            if gate is not None and not gate(i):
                results[i] = CallSkipped()
                continue
            self.calls.append(messages[i].to)
            if self.answers[messages[i].to] == "ok":
                outcome = SendResult(provider=NAME, provider_message_id=f"m-{messages[i].to}")
            else:
                outcome = ContactInvalidError(NAME, "UNREGISTERED", "token gone", reason="unregistered")
            results[i] = outcome
            if on_result is not None:
                on_result(i, outcome, 1)
        return results


rows_strategy = st.lists(
    st.tuples(st.integers(1, 3),                                    # calls (devices) of the row
              st.lists(st.sampled_from(["ok", "invalid"]), min_size=3, max_size=3),
              st.booleans()),                                       # the lease gate refuses its calls
    min_size=1, max_size=25)


@pytest.fixture(autouse=True)
def _fake_provider(settings, monkeypatch):
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, NAME: {"RATE_PER_S": 1e7}}
    settings.NOTIFY = {**settings.NOTIFY, "LEASE_HEARTBEAT": False}
    yield
    r = get_redis()
    keys = list(r.scan_iter(f"*:{NAME}*"))
    if keys:
        r.delete(*keys)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_strategy, order=st.permutations(list(range(8))), every=st.integers(1, 10))
def test_each_row_is_recorded_once_and_only_when_its_calls_have_ended(rows, order, every, monkeypatch, settings):
    settings.NOTIFY = {**settings.NOTIFY, "RECORD_EVERY_ROWS": every, "SEND_CONCURRENCY": {"push": 4}}
    keeper = leases.LeaseKeeper()
    monkeypatch.setattr(leases, "_keeper", keeper)
    items, answers, refused, planned = [], {}, set(), {}
    for r, (devices, outcomes, gated) in enumerate(rows):
        n = Notification(id=uuid.uuid4(), channel="push", priority="standard", attempts=1)
        keeper.hold([(n.pk, 1)], clock.now() + timedelta(hours=1))
        if gated:
            refused.add(n.pk)
        planned[n.pk] = devices
        for d in range(devices):
            to = f"tok-{r}-{d}"
            answers[to] = outcomes[d]
            items.append(Item(n, None, OutboundMessage(notification_id=str(n.pk), channel="push", to=to, body="b")))
    backend = FakeBackend(answers, order)
    monkeypatch.setattr(calls, "get_backend", lambda channel, name: backend)
    # The lease keeper's in-memory answer, right before each call (e.g. a heartbeat that stalled).
    monkeypatch.setattr(calls, "covers_call", lambda pk: pk not in refused)
    settled: list = []

    def settle(pks, done):
        for pk in pks:
            ended = [i for i, item in enumerate(items) if item.row.pk == pk and done.outcomes.get(i)]
            assert len(ended) == planned[pk], "settled before all its calls ended"
        settled.extend(pks)

    done = call_standard("push", NAME, items, settle)

    # Every call made is noted exactly once, in the item it belongs to; refused ones are not.
    assert sorted(backend.calls) == sorted(item.message.to for item in items if item.row.pk not in refused)
    for i, item in enumerate(items):
        assert len(done.outcomes.get(i, [])) == (0 if item.row.pk in refused else 1)
    # Each row at most once in settle, only complete and never lost rows; the rest is the end's.
    assert len(settled) == len(set(settled))
    assert not set(settled) & refused
    assert done.lost == refused
    assert set(settled) == done.settled
    at_the_end = {pk for pk in planned if pk not in done.settled and pk not in done.lost}
    assert at_the_end | done.settled | done.lost == set(planned)
    assert not at_the_end & done.settled
    # With a cadence of one row, everything that could be recorded early was.
    if every == 1:
        assert at_the_end == set()

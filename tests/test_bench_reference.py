"""The bench's reference designs in-process against a real emulator subprocess and Postgres: the naive
baseline's tasks (bench/naive.py, run eagerly: Celery's documented test mode) and the durable ceiling's
batch (bench/ceilings.py). Exact outcomes: rows, statuses, what the emulator received."""

from __future__ import annotations

import os
import uuid

import pytest

from bench import ceilings, naive
from campaigns.models import Segment, SegmentMember
from notifications.models import Notification
from preferences.models import Device, Recipient
from providers.registry import get_backend, reset_backends
from tests.providers.conftest import sendgrid_options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def email_provider(settings, module_emulator):
    module_emulator.reset()
    name = f"sg{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "email": [
        {"NAME": name, "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
         "OPTIONS": sendgrid_options(module_emulator)}]}
    reset_backends()
    yield name
    reset_backends()


@pytest.fixture
def eager():
    naive.app.conf.task_always_eager = True
    yield
    naive.app.conf.task_always_eager = False


def segment_of(count: int) -> tuple[str, list[Recipient]]:
    tag = uuid.uuid4().hex[:8]
    segment = Segment.objects.create(segment_id=f"naive-{tag}", name=tag)
    people = [Recipient.objects.create(user_id=f"n-{tag}-{i}", email=f"n{tag}{i}@example.org",
                                       attributes={"first_name": f"F{i}"}) for i in range(count)]
    for person in people:
        SegmentMember.objects.create(segment=segment, recipient=person)
        Device.objects.create(recipient=person, platform="android", push_token=f"tok-{person.pk}")
    return segment.segment_id, people


def test_naive_fan_out_inserts_one_row_per_member_and_each_task_sends_it_once(email_provider, module_emulator, eager):
    segment_id, people = segment_of(3)
    campaign_id = str(uuid.uuid4())

    assert naive.fan_out.delay(segment_id, "email", campaign_id, "Hi", "Hello {{ first_name }}").get() == 3

    rows = Notification.objects.filter(campaign_id=campaign_id)
    assert sorted(rows.values_list("recipient_id", "status", "provider", "attempts", "body")) == [
        (p.pk, "sent", email_provider, 1, f"Hello F{i}") for i, p in enumerate(people)]
    assert {str(r.id) for r in rows} == {str(uuid.uuid5(uuid.UUID(campaign_id), p.pk)) for p in people}
    received = module_emulator.messages(provider="sendgrid")
    assert sorted((m["to"], m["notification_id"]) for m in received) == sorted(
        (p.email, str(uuid.uuid5(uuid.UUID(campaign_id), p.pk))) for p in people)

    naive.send_one.delay(str(rows[0].id)).get()  # a redelivered task: the row is no longer queued
    assert module_emulator.count(provider="sendgrid") == 3


def test_naive_send_one_marks_the_row_failed_after_its_retries(email_provider, module_emulator, eager):
    _, (person,) = segment_of(1)
    row = Notification.objects.create(id=uuid.uuid4(), recipient=person, channel="email", title="Hi", body="B",
                                      status="queued")
    module_emulator.call("POST", "/_emulator/faults", {"provider": "sendgrid", "status": 400})

    naive.send_one.delay(str(row.pk)).get()

    row.refresh_from_db()
    assert row.status == "failed" and row.sent_at is None
    assert module_emulator.count(provider="sendgrid") == 0
    assert module_emulator.stats("sendgrid")["requests"] == naive.MAX_RETRIES + 1


def test_durable_ceiling_inserts_sends_and_marks_each_batch_then_deletes_its_rows(email_provider, module_emulator):
    segment_of(2)
    backend = get_backend("email")
    run = ceilings.durable_sender("email", lambda batch: backend.send_batch(batch, concurrency=1))
    batch = ceilings.build_messages("email", 5, "t")

    results = run(batch)

    rows = Notification.objects.filter(category=ceilings.DURABLE_CATEGORY)
    assert [type(r).__name__ for r in results] == ["SendResult"] * 5
    assert sorted(set(rows.values_list("status", "provider", "attempts"))) == [("sent", email_provider, 1)]
    assert rows.count() == 5 and not rows.filter(sent_at=None).exists()
    assert sorted(m["notification_id"] for m in module_emulator.messages(provider="sendgrid")) == sorted(
        str(pk) for pk in rows.values_list("pk", flat=True))
    assert ceilings.delete_durable_rows() == 5
    assert not Notification.objects.filter(category=ceilings.DURABLE_CATEGORY).exists()


@pytest.mark.parametrize(("pool", "workers"), [("prefork", 1), ("threads", os.cpu_count() or 1)])
def test_the_naive_stack_runs_the_emulator_and_its_own_workers_only(tmp_path, pool, workers):
    from bench.production_stack import BenchStack

    stack = BenchStack("postgres://x/y", "redis://x/3", tmp_path, pipeline="naive", naive_pool=pool,
                       naive_concurrency=16, log_dir=tmp_path)
    commands = stack.commands()
    assert sorted(commands) == ["emulator", *sorted(stack.naive_workers())] and len(stack.naive_workers()) == workers
    for kind, command in stack.naive_workers().items():
        joined = " ".join(command)
        assert kind.startswith("worker_naive") and "-A bench.naive worker" in joined
        assert f"-Q {naive.QUEUE} --pool {pool} --concurrency 16" in joined
    assert not any("-A config" in " ".join(c) for c in commands.values())
